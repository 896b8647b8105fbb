"""``pdm run bench``: the seed's fp32-vs-AMP comparison outside Jupyter, measured correctly.

``--model conv`` (default) trains the seed's ConvModel on the seed problem; ``--model transformer``
trains the course's decoder-only transformer on the sequence-reversal task (and also reports the
final answer accuracy on held-out sequences).

For fp32 and every AMP dtype the device supports it reports training and inference time per step
(median and interquartile range over the timed steps, after warm-up), peak allocator memory where
the device has one, saved-activation bytes (every device), the final loss and ratios against fp32.
The time ratios come from a second pass in which fresh models of every mode take turns step by
step with fp32 and a second fp32 model (``amp_tutorial.interleave``: the median over blocks, its
90% interval, stated only where the A/A control holds 1), so a load that comes or goes on a
shared machine meets every mode alike.
``--compile`` runs the same modes through ``torch.compile`` and reports the compile time (first
call minus a median step) apart from the step time; the compile lesson explains what changes.

Before the models, the same run measures this device's matmul rate in fp32 and each
low-precision dtype at two sizes (``amp_tutorial.ceiling``): the ratio is the most a matmul-bound
step can gain, and each model's gain is printed next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from amp_tutorial.ceiling import FP32_LIKE, SIZES, Ceiling, matmul_ceiling
from amp_tutorial.data import make_problem
from amp_tutorial.device import (
    DeviceInfo,
    DeviceNotAvailableError,
    dtype_name,
    fp32_baseline,
    select_device,
    set_strict_fp32,
    tf32_in_use,
)
from amp_tutorial.host_memory import MALLOC_ENV, keep_freed_memory
from amp_tutorial.interleave import MIN_BLOCKS, PairedComparison, interleave, numbered
from amp_tutorial.ladder import matmul_rate_tflops
from amp_tutorial.measure import (
    SavedBytes,
    Timing,
    free_memory,
    fresh_compile_cache,
    peak_memory_bytes,
    reset_peak_memory,
    saved_bytes,
    time_steps,
)
from amp_tutorial.mfu import Utilization, compute_dtype, peak_for, percent, step_flops
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import Preset, UnknownPresetError, get_preset
from amp_tutorial.reversal_task import make_transformer_problem, sequence_loss
from amp_tutorial.steps import (
    make_inference_step,
    make_sequence_train_step,
    make_train_step,
    sequence_accuracy,
)
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig

SEED = 0
LEARNING_RATE = 1e-3
MODELS = ("conv", "transformer")


@dataclass
class ModeResult:
    """What one precision mode measured; times in seconds per step, memory in bytes.
    """

    mode: str
    amp_dtype: str | None
    grad_scaler: bool
    train_median_s: float
    train_iqr_s: float
    infer_median_s: float
    infer_iqr_s: float
    train_peak_bytes: int | None
    infer_peak_bytes: int | None
    saved_activation_bytes: int  # activations saved for backward (``SavedBytes.activations``)
    final_loss: float
    cast_weight_bytes: int = 0  # autocast's 16-bit weight copies saved for backward
    train_speedup: float = 1.0  # t_fp32 / t_mode
    infer_speedup: float = 1.0
    activation_ratio: float = 1.0  # bytes_mode / bytes_fp32
    train_peak_ratio: float | None = None
    infer_peak_ratio: float | None = None
    final_accuracy: float | None = None  # transformer: answer accuracy on held-out sequences
    train_compile_s: float | None = None  # --compile: first call minus a median step
    infer_compile_s: float | None = None
    matmul_ceiling: float | None = None  # best t_fp32 / t_amp_dtype of a matmul, this run; None
    # where that ratio bounds nothing (an emulated dtype, noisy timings: Ceiling.why_no_ceiling)
    train_flops: int | None = None  # model FLOPs of one training step (FlopCounterMode, meta)
    train_tflops: float | None = None  # achieved: train_flops / train_median_s
    mfu: float | None = None  # train_tflops / the GPU's datasheet peak of its dtype (mfu.PEAKS)
    of_matmul: float | None = None  # train_tflops / this run's measured matmul rate of its dtype
    # the speedups' 90% intervals from the interleaved pass ("0.45-0.55"; None for a compiled
    # mode, whose speedups are its medians' ratio), and why a speedup is not a result here
    train_interval: str | None = None
    infer_interval: str | None = None
    train_noise: str | None = None
    infer_noise: str | None = None
    timed: str | None = None  # what the interleaved pass read: wall time, or CPU time per core


def run_mode(
    info: DeviceInfo,
    preset: Preset,
    amp_dtype: torch.dtype | None,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    progress: bool = True,
    compile_backend: str | None = None,
) -> ModeResult:
    """Train and then time inference of a fresh, identically seeded model in one precision mode.

    With ``compile_backend`` (e.g. ``"inductor"``) the model runs through ``torch.compile``; the
    first call, which compiles, is timed on its own and never counted as a step.
    """
    label = dtype_name(amp_dtype) if amp_dtype else fp32_baseline(info)
    label += " compiled" if compile_backend else ""
    reset_peak_memory(info.device)
    model = _conv_model(info, preset, inputs)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scaler = _scaler(info, amp_dtype)
    use_scaler = scaler.is_enabled()
    net = torch.compile(model, backend=compile_backend) if compile_backend else model
    train_step = make_train_step(net, optimizer, inputs, targets, amp_dtype, scaler)
    train_first = _first_call_s(train_step, info.device) if compile_backend else None
    train_timing, losses = time_steps(train_step, preset.steps, info.device,
                                      _warmup(preset, compile_backend), desc=f"train {label}",
                                      progress=progress)
    train_peak = peak_memory_bytes(info.device)

    def forward_and_loss() -> None:
        with torch.autocast(info.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            torch.nn.functional.mse_loss(model(inputs), targets)

    activation_bytes = saved_bytes(forward_and_loss, model)

    del optimizer, scaler, train_step
    reset_peak_memory(info.device)
    infer_step = make_inference_step(net, inputs, amp_dtype)
    infer_first = _first_call_s(infer_step, info.device) if compile_backend else None
    infer_timing, _ = time_steps(infer_step, preset.inference_steps, info.device,
                                 _warmup(preset, compile_backend), desc=f"infer {label}",
                                 progress=progress, keep_all=False)
    infer_peak = peak_memory_bytes(info.device)
    return _result(label, amp_dtype, use_scaler, train_timing, infer_timing, train_peak,
                   infer_peak, activation_bytes, losses,
                   train_compile_s=_minus(train_first, train_timing.median),
                   infer_compile_s=_minus(infer_first, infer_timing.median))


def _result(label: str, amp_dtype: torch.dtype | None, use_scaler: bool, train: Timing,
            infer: Timing, train_peak: int | None, infer_peak: int | None,
            saved: SavedBytes, losses: Sequence[float], **extra: float | None) -> ModeResult:
    """One mode's row from its measurements (``extra``: the model- or compile-specific fields)."""
    return ModeResult(
        mode=label, amp_dtype=dtype_name(amp_dtype) if amp_dtype else None,
        grad_scaler=use_scaler, train_median_s=train.median, train_iqr_s=train.iqr,
        infer_median_s=infer.median, infer_iqr_s=infer.iqr, train_peak_bytes=train_peak,
        infer_peak_bytes=infer_peak, saved_activation_bytes=saved.activations,
        cast_weight_bytes=saved.cast_weights,
        final_loss=float(losses[-1]), **extra)


def run_transformer_mode(
    info: DeviceInfo,
    preset: Preset,
    amp_dtype: torch.dtype | None,
    config: TransformerConfig,
    train: list[tuple[torch.Tensor, torch.Tensor]],
    test: list[tuple[torch.Tensor, torch.Tensor]],
    progress: bool = True,
) -> tuple[ModeResult, list[float]]:
    """Train a fresh, identically seeded transformer in one precision mode, then time inference.

    Returns the result row and the per-step training losses (to plot them).
    """
    sizes = preset.transformer
    label = dtype_name(amp_dtype) if amp_dtype else fp32_baseline(info, ("matmuls",))
    reset_peak_memory(info.device)
    torch.manual_seed(SEED)
    model = DecoderTransformer(config).to(info.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sizes.lr)
    scaler = _scaler(info, amp_dtype)
    use_scaler = scaler.is_enabled()
    train_step = make_sequence_train_step(model, optimizer, train, amp_dtype, scaler)
    train_timing, losses = time_steps(train_step, sizes.steps, info.device, sizes.warmup,
                                      desc=f"train {label}", progress=progress)
    train_peak = peak_memory_bytes(info.device)

    def forward_and_loss() -> None:
        with torch.autocast(info.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            sequence_loss(model(train[0][0]), train[0][1])

    activation_bytes = saved_bytes(forward_and_loss, model)
    accuracy = sequence_accuracy(model, test, amp_dtype)

    del optimizer, scaler, train_step
    reset_peak_memory(info.device)
    infer_step = make_inference_step(model, test[0][0], amp_dtype)
    infer_timing, _ = time_steps(infer_step, max(2, sizes.steps // 4), info.device, sizes.warmup,
                                 desc=f"infer {label}", progress=progress, keep_all=False)
    infer_peak = peak_memory_bytes(info.device)
    result = _result(label, amp_dtype, use_scaler, train_timing, infer_timing, train_peak,
                     infer_peak, activation_bytes, losses, final_accuracy=accuracy)
    return result, [float(loss) for loss in losses]


def run_transformer_benchmark(info: DeviceInfo, preset: Preset, progress: bool = True
                              ) -> tuple[list[ModeResult], dict[str, list[float]]]:
    """fp32 first, then each AMP dtype the device supports; also returns each mode's losses.
    """
    config, train, test = make_transformer_problem(preset, info.device)
    results, losses = [], {}
    modes = [None, *info.amp_dtypes]
    for amp_dtype in tqdm(modes, desc="modes", disable=not progress):
        result, history = run_transformer_mode(info, preset, amp_dtype, config, train, test,
                                               progress)
        results.append(result)
        losses[result.mode] = history
    sizes = preset.transformer

    def model() -> DecoderTransformer:
        torch.manual_seed(SEED)
        return DecoderTransformer(config).to(info.device)

    def train_step(amp_dtype: torch.dtype | None) -> Callable[[int], object]:
        net = model()
        return make_sequence_train_step(net, torch.optim.AdamW(net.parameters(), lr=sizes.lr),
                                        train, amp_dtype, _scaler(info, amp_dtype))

    def infer_step(amp_dtype: torch.dtype | None) -> Callable[[int], object]:
        return make_inference_step(model(), test[0][0], amp_dtype)

    add_ratios(results, compare_modes(
        info, {"train": (train_step, sizes.steps), "infer": (infer_step, max(2, sizes.steps // 4))},
        [(r.mode, m) for r, m in zip(results, modes, strict=True)], sizes.warmup, preset.name,
        progress))
    return results, losses


CONTROL = "fp32 again"  # fp32 built twice: the interleaved pass's A/A control


Build = Callable[[torch.dtype | None], Callable[[int], object]]  # a fresh model's step, per dtype


def compare_modes(info: DeviceInfo, builds: dict[str, tuple[Build, int]],
                  modes: Sequence[tuple[str, torch.dtype | None]], warmup: int, preset: str,
                  progress: bool = True) -> dict[str, dict[str, PairedComparison]]:
    """Per part ("train", "infer": its step builder and how many steps each mode's own run
    timed), each of ``modes`` (label, AMP dtype or None; fp32 first) against fp32, from steps
    that take turns (``interleave``, ``_blocks`` of them, ``warmup`` steps per mode untimed
    first): every mode's step built fresh by ``build(amp_dtype)``, fp32's twice, the second its
    A/A control."""
    (baseline, _), *others = modes
    compared = {}
    for part, (build, steps) in builds.items():
        runs = {label: numbered(build(dtype)) for label, dtype in modes}
        runs[CONTROL] = numbered(build(None))
        try:
            timed = interleave(runs, baseline, CONTROL, info.device, _blocks(steps),
                               warmup=max(1, warmup // 2), preset=preset, progress=progress)
        finally:
            runs.clear()
            free_memory(info.device)
        compared[part] = {label: timed.comparison(label) for label, _ in others}
    return compared


def _blocks(steps: int) -> int:
    """Interleaved blocks for a mode timed ``steps`` steps in its own run: an eighth of them,
    at least ``MIN_BLOCKS`` (each block runs every mode twice)."""
    return max(MIN_BLOCKS, steps // 8)


def _conv_model(info: DeviceInfo, preset: Preset, inputs: torch.Tensor) -> ConvModel:
    """A fresh ConvModel seeded ``SEED``, in the inputs' memory format."""
    torch.manual_seed(SEED)
    return ConvModel(preset.hidden, preset.n_hidden_layers).to(
        info.device, memory_format=_memory_format(inputs))


def _scaler(info: DeviceInfo, amp_dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """A GradScaler, on where ``amp_dtype`` needs one on this device (fp16)."""
    return torch.amp.GradScaler(info.type, enabled=amp_dtype is not None
                                and info.needs_grad_scaler(amp_dtype))


def _first_call_s(step: Callable[[int], object], device: torch.device) -> float:
    """Seconds of one synchronised call: with torch.compile, the call that compiles."""
    return time_steps(step, 1, device, progress=False)[0].median


def _warmup(preset: Preset, compile_backend: str | None) -> int:
    return max(preset.warmup - 1, 0) if compile_backend else preset.warmup  # first call warms up


def _minus(first: float | None, median: float) -> float | None:
    return None if first is None else max(first - median, 0.0)


def _memory_format(tensor: torch.Tensor) -> torch.memory_format:
    channels_last = tensor.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last else torch.contiguous_format


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b


def add_ratios(results: list[ModeResult],
               compared: dict[str, dict[str, PairedComparison]] | None = None) -> None:
    """Fill in speedups (t_fp32 / t_amp) and memory ratios (amp / fp32) against the first row:
    a speedup from ``compared[part][mode]`` (the interleaved pass, ``part`` "train" or "infer")
    where there is one, with its interval and why it is not a result, else the medians' ratio.
    """
    base = results[0]
    for r in results:
        r.train_speedup = base.train_median_s / r.train_median_s
        r.infer_speedup = base.infer_median_s / r.infer_median_s
        r.activation_ratio = r.saved_activation_bytes / base.saved_activation_bytes
        r.train_peak_ratio = _ratio(r.train_peak_bytes, base.train_peak_bytes)
        r.infer_peak_ratio = _ratio(r.infer_peak_bytes, base.infer_peak_bytes)
        for part, by_mode in (compared or {}).items():
            c = by_mode.get(r.mode)
            if c is not None:
                setattr(r, f"{part}_speedup", c.ratio)
                setattr(r, f"{part}_interval", f"{c.estimate.low:.2f}-{c.estimate.high:.2f}")
                setattr(r, f"{part}_noise", c.noise)
                r.timed = c.basis


MEMORY_FORMATS = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}


def run_benchmark(info: DeviceInfo, preset: Preset, progress: bool = True,
                  memory_format: str = "channels_last",
                  compile_backend: str | None = None) -> list[ModeResult]:
    """fp32 first (the baseline), then each AMP dtype the device supports, in one memory format.

    With ``compile_backend``, eager fp32 stays the baseline and every mode is run again compiled.
    """
    inputs, targets = make_problem(preset.grid, info.device, MEMORY_FORMATS[memory_format])
    modes: list[torch.dtype | None] = [None, *info.amp_dtypes]
    runs = [(m, None) for m in modes] + [(m, compile_backend) for m in modes if compile_backend]
    results = [run_mode(info, preset, m, inputs, targets, progress, backend)
               for m, backend in tqdm(runs, desc="modes", disable=not progress)]

    def train_step(amp_dtype: torch.dtype | None) -> Callable[[int], object]:
        net = _conv_model(info, preset, inputs)
        return make_train_step(net, torch.optim.Adam(net.parameters(), lr=LEARNING_RATE),
                               inputs, targets, amp_dtype, _scaler(info, amp_dtype))

    def infer_step(amp_dtype: torch.dtype | None) -> Callable[[int], object]:
        return make_inference_step(_conv_model(info, preset, inputs), inputs, amp_dtype)

    # the eager modes; compiled ones keep their medians' ratio (their graphs belong to the
    # compile runs above)
    add_ratios(results, compare_modes(
        info, {"train": (train_step, preset.steps), "infer": (infer_step, preset.inference_steps)},
        [(r.mode, m) for r, m in zip(results, modes, strict=False)], preset.warmup, preset.name,
        progress))
    return results


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f}"


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def _table(cols: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in [cols, *rows]]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def add_ceiling(results: list[ModeResult], ceiling: Ceiling) -> None:
    """Give each AMP row the matmul ceiling of its dtype measured in this run (None where the
    ratio is no ceiling)."""
    for r in results:
        if r.amp_dtype in ceiling.low_dtypes:
            r.matmul_ceiling = ceiling.ceiling(r.amp_dtype)


def model_step_flops(model: str, preset: Preset) -> int:
    """Model FLOPs of one training step of ``model`` at ``preset`` (counted on meta tensors)."""
    if model == "transformer":
        t = preset.transformer
        config = TransformerConfig(t.n_symbols + 1, t.seq_len, t.d_model, t.n_layers, t.n_heads)
        return step_flops(lambda: (DecoderTransformer(config), (
            torch.zeros(t.batch, t.seq_len, dtype=torch.long),) * 2),
            lambda m, x, y: sequence_loss(m(x), y))
    return step_flops(lambda: (ConvModel(preset.hidden, preset.n_hidden_layers), (
        torch.zeros(1, 2, preset.grid, preset.grid), torch.zeros(1, 1, preset.grid, preset.grid))),
        lambda m, x, y: torch.nn.functional.mse_loss(m(x), y))


def add_utilization(results: list[ModeResult], flops: int, info: DeviceInfo, ceiling: Ceiling,
                    fp32_like: str) -> None:
    """Each row's achieved TFLOP/s, MFU (against the datasheet peak of the dtype it computes in;
    fp32 rows against TF32's where its matmuls or convolutions use TF32) and share of the
    measured matmul rate."""
    peak = peak_for(info.name, info.type)
    for r in results:
        compute = compute_dtype(r.amp_dtype, tf32=fp32_like in tf32_in_use(info))
        u = Utilization(flops, r.train_median_s, peak.tflops.get(compute) if peak else None,
                        matmul_rate_tflops(ceiling, compute))
        r.train_flops, r.train_tflops, r.mfu, r.of_matmul = flops, u.tflops, u.mfu, u.of_matmul


def gain_lines(results: list[ModeResult], ceiling: Ceiling) -> list[str]:
    """Each AMP row's gains next to its matmul ceiling (what the rest of the step costs), or
    what the matmul ratio is where it bounds nothing."""
    return [f"{r.mode}: no training ratio here ({r.train_noise})" if r.train_noise else
            f"{r.mode}: training {r.train_speedup:.2f}x, inference {_speedup(r, 'infer')}, "
            f"{ceiling.describe(r.amp_dtype, r.train_speedup)}"
            for r in results if r.amp_dtype in ceiling.low_dtypes]


def format_table(info: DeviceInfo, preset: Preset, results: list[ModeResult],
                 memory_format: str = "channels_last", model: str = "conv",
                 ceiling: Ceiling | None = None) -> str:
    """The human-readable report: a time table and a memory table, one row per mode, and the
    matmul ceiling with each mode's gain next to it.
    """
    if model == "transformer":
        t = preset.transformer
        header = (f"preset: {preset.name}; model: transformer ({t.n_layers} layers, width "
                  f"{t.d_model}, {t.n_heads} heads, seq {t.seq_len}, batch {t.batch}, {t.steps} "
                  f"training steps, {max(2, t.steps // 4)} inference steps, {t.warmup} warm-up); "
                  f"task: reverse {t.seq_len // 2} of {t.n_symbols} symbols")
    else:
        header = (f"preset: {preset.name} (grid {preset.grid}, hidden {preset.hidden}, "
                  f"{preset.n_hidden_layers} hidden layers, {preset.steps} training steps, "
                  f"{preset.inference_steps} inference steps, {preset.warmup} warm-up); memory "
                  f"format: {memory_format}")
    header = f"device: {info}\n{keep_freed_memory()}\n{header}"
    with_accuracy = any(r.final_accuracy is not None for r in results)
    time_table = _table(
        ["mode", "scaler", "train ms/step", "IQR", "speedup", "infer ms/step", "IQR", "speedup",
         "final loss", *(["accuracy"] if with_accuracy else []), "compile s (train/infer)"],
        [[r.mode, "yes" if r.grad_scaler else "no",
          f"{r.train_median_s * 1e3:.2f}", f"{r.train_iqr_s * 1e3:.2f}", _speedup(r, "train"),
          f"{r.infer_median_s * 1e3:.2f}", f"{r.infer_iqr_s * 1e3:.2f}", _speedup(r, "infer"),
          f"{r.final_loss:.4g}", *([f"{r.final_accuracy:.3f}"] if with_accuracy else []),
          _compile_text(r)] for r in results])
    memory_table = _table(
        ["mode", "saved activations MB", "ratio", "cast weights MB", "train peak MB", "ratio",
         "infer peak MB", "ratio"],
        [[r.mode, _mb(r.saved_activation_bytes), f"{r.activation_ratio:.2f}",
          _mb(r.cast_weight_bytes),
          _mb(r.train_peak_bytes), _ratio_text(r.train_peak_ratio),
          _mb(r.infer_peak_bytes), _ratio_text(r.infer_peak_ratio)] for r in results])
    timed = next((r.timed for r in results if r.timed), "wall time")
    unstated = [f"{r.mode} {part}: {why}" for r in results for part in ("train", "infer")
                if (why := getattr(r, f"{part}_noise"))]
    notes = ("speedup = t_fp32 / t_mode from fresh models taking turns step by step with fp32 "
             f"and a second fp32 model\n(the control), {timed}: the median over blocks and its "
             "90% interval; a compiled mode's is its medians' ratio;\n"
             + "".join(f"no ratio for {line}\n" for line in unstated)
             + "ms/step: each mode's own run (median per step, after warm-up); IQR = "
             "interquartile range;\n"
             + ("accuracy = answer tokens right on held-out sequences;\n" if with_accuracy else "")
             + "ratio = mode / fp32; peak MB is the caching allocator's peak (n/a on CPU and "
             "MPS);\nsaved activations = bytes autograd keeps for backward in one forward + loss, "
             "the weights\nleft out; cast weights = autocast's 16-bit weight copies it keeps too.")
    if any(r.train_tflops is not None for r in results):
        flops_table = _table(
            ["mode", "GFLOP/step", "TFLOP/s", "MFU", "of matmul"],
            [[r.mode, f"{r.train_flops / 1e9:.4g}", f"{r.train_tflops:.3g}", percent(r.mfu),
              percent(r.of_matmul)] for r in results if r.train_tflops is not None])
        memory_table += ("\n\nUtilization (training; MFU = achieved / the GPU's datasheet peak "
                         "of the dtype it computes in: the fp32 row's against fp32's or TF32's, "
                         "several times lower,\nso compare rows by time or TFLOP/s; of matmul = "
                         "achieved / the matmul rate measured below)\n" + flops_table)
    text = f"{header}\n\nTime\n{time_table}\n\nMemory\n{memory_table}\n\n{notes}"
    if ceiling is None:
        return text
    return "\n".join([
        text, "", "Ceiling: matmul GFLOP/s, median (quartile range), measured in this run",
        *ceiling.lines(), "", "AMP gain against fp32 (t_fp32 / t_mode), next to the best matmul "
        "ratio of its dtype", *gain_lines(results, ceiling)])


def _speedup(r: ModeResult, part: str) -> str:
    """A speedup cell: the ratio with its interval, "no ratio" (the notes say why), or the
    medians' ratio where the mode was not interleaved."""
    if getattr(r, f"{part}_noise"):
        return "no ratio"
    interval = getattr(r, f"{part}_interval")
    ratio = _x(getattr(r, f"{part}_speedup"))
    return f"{ratio} ({interval})" if interval else ratio


def _compile_text(r: ModeResult) -> str:
    if r.train_compile_s is None or r.infer_compile_s is None:
        return "-"
    return f"{r.train_compile_s:.1f} / {r.infer_compile_s:.1f}"


def _ratio_text(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}"


def main(argv: list[str] | None = None) -> int:
    """The ``pdm run bench`` command: parse the options, run every mode, print or write JSON.
    """
    parser = argparse.ArgumentParser(prog="pdm run bench", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", help="paper, cpu, small, smoke or auto (default: "
                        "$AMP_TUTORIAL_PRESET or auto)")
    parser.add_argument("--device", help="cuda, cuda:N, mps, xpu or cpu (default: "
                        "$AMP_TUTORIAL_DEVICE or the best available)")
    parser.add_argument("--strict-fp32", action="store_true",
                        help="switch TF32 off so the fp32 baseline is true fp32 on Ampere+ GPUs")
    parser.add_argument("--model", choices=MODELS, default="conv",
                        help="conv: the seed's ConvModel (default); transformer: the course's "
                        "decoder-only transformer on the sequence-reversal task")
    parser.add_argument("--memory-format", choices=list(MEMORY_FORMATS), default="channels_last",
                        help="tensor layout for both fp32 and AMP (default: channels_last, the "
                        "layout fast convolution kernels use; contiguous = NCHW as in the seed)")
    parser.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                        help="also run every mode through torch.compile (default backend: "
                        "inductor; aot_eager traces without generating code) and report the "
                        "compile time apart from the step time")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="write the results as JSON to PATH (or stdout with no PATH)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's malloc as it is: freed buffers go back to the OS and "
                        "every step page-faults them in again (amp_tutorial.host_memory)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    if args.system_malloc:
        os.environ[MALLOC_ENV] = "system"  # read once, by select_device's keep_freed_memory()
    if args.compile and args.model != "conv":
        parser.error("--compile runs the conv model only; the compile lesson compiles the "
                     "transformer")
    try:
        info = select_device(args.device)
        preset = get_preset(args.preset, info.type)
    except (DeviceNotAvailableError, UnknownPresetError) as err:
        parser.exit(2, f"error: {err}\n")
    if args.strict_fp32:
        set_strict_fp32(True)
    # each model's fp32 matmul row as its own fp32 baseline runs: TF32 as its convolutions
    # (ConvModel) or its matmuls (transformer) may use it now
    ceiling = matmul_ceiling(info, SIZES[preset.name], FP32_LIKE[args.model])
    if args.model == "transformer":
        results, _ = run_transformer_benchmark(info, preset, progress=not args.no_progress)
    else:
        with fresh_compile_cache():  # compile times are cold ones, never a cache hit
            results = run_benchmark(info, preset, progress=not args.no_progress,
                                    memory_format=args.memory_format, compile_backend=args.compile)
    add_ceiling(results, ceiling)
    add_utilization(results, model_step_flops(args.model, preset), info, ceiling,
                    FP32_LIKE[args.model])
    report = {
        "device": str(info.device), "backend": info.backend, "device_name": info.name,
        "torch": torch.__version__, "preset": asdict(preset), "baseline": results[0].mode,
        "model": args.model, "memory_format": args.memory_format, "compile": args.compile,
        "host_memory": keep_freed_memory(),
        "ceiling": {"sizes": list(ceiling.sizes), **ceiling.as_dict()},
        "results": [asdict(r) for r in results],
    }
    if args.json == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(format_table(info, preset, results, args.memory_format, args.model, ceiling))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=2)
            print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
