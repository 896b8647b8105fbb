"""The path from plain AMP toward the hardware's limit: one rung at a time, each measured in MFU.

The course's transformer on the sequence-reversal task, trained in a series of *rungs*, each
changing one thing over the rung before (or, for the dtype rows, beside it):

1. ``fp32``: the baseline;
2. ``AMP``: autocast in the device's first AMP dtype (with a GradScaler for fp16);
3. ``+ fused AdamW``: the optimizer's update in one kernel per parameter group
   (``AdamW(fused=True)``) instead of a loop of foreach kernels;
4. ``+ torch.compile``: Inductor fuses the memory-bound ops (norms, GELU, adds, casts);
5. ``+ CUDA graphs``: ``mode="reduce-overhead"`` replays the step's kernels as one graph, so no
   launch gaps are left (CUDA only: a CPU has no kernels to record);
6. ``+ batch x4``: four times the tokens per step, so each matmul is larger;
7. the other 16-bit dtype at rung 6's settings, and pure bf16 (weights and optimizer state in
   bf16, no autocast; lesson 15 shows what that costs in accuracy) at those settings.

Each rung's model FLOPs are counted (``amp_tutorial.mfu``), its steps timed (median, quartile
range) and profiled into groups (``amp_tutorial.step_profile``). ``sweep`` times fp32 and AMP over
the transformer's width and tokens per step: how the gain grows with the model.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from amp_tutorial.ceiling import Ceiling
from amp_tutorial.device import DeviceInfo, dtype_name, tf32_in_use
from amp_tutorial.interleave import BLOCKS, PairedComparison, interleave, numbered
from amp_tutorial.measure import (
    Timing,
    free_memory,
    fresh_compile_cache,
    time_steps,
    why_noisy,
)
from amp_tutorial.mfu import (
    WEIGHT_MATMULS,
    Peak,
    Utilization,
    compute_dtype,
    op_flops,
    peak_for,
    percent,
)
from amp_tutorial.presets import TransformerSizes
from amp_tutorial.reversal_task import ReversalTask, sequence_loss
from amp_tutorial.step_profile import TimeShares, profile_steps, time_shares
from amp_tutorial.steps import make_sequence_train_step
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig

SEED = 0
WARMUP = 3  # compiles (first call) and records CUDA graphs (second and third) before timing
MFU_GOAL = 0.40  # issue 45: the course's transformer under AMP on an H100
BATCH_SCALE = 4
CONTROL = "fp32 again"  # the first rung built twice: compare_rungs' A/A control


@dataclass(frozen=True)
class Rung:
    """One configuration of the training step, and in words what it changed."""

    name: str
    change: str
    amp_dtype: torch.dtype | None = None
    pure_bf16: bool = False
    fused: bool = False
    compile_mode: str | None = None  # None: eager; "default" or "reduce-overhead"
    batch_scale: int = 1

    @property
    def compute(self) -> str | None:
        """The 16-bit dtype the matmuls run in, or None for fp32."""
        return "bf16" if self.pure_bf16 else (dtype_name(self.amp_dtype) if self.amp_dtype
                                              else None)


def ladder_rungs(info: DeviceInfo) -> list[tuple[Rung, str | None]]:
    """The rungs for this device, each with None or why it does not apply here."""
    amp = info.amp_dtype
    if amp is None:
        return [(Rung("fp32", "the baseline"), None)]
    name = dtype_name(amp)
    fused = Rung(f"AMP {name} + fused AdamW", "the optimizer's update in one fused kernel",
                 amp, fused=True)
    compiled = dataclasses.replace(fused, name=f"AMP {name} + compile",
                                   change="torch.compile: Inductor fuses the memory-bound ops",
                                   compile_mode="default")
    graphs = dataclasses.replace(compiled, name=f"AMP {name} + CUDA graphs",
                                 change='mode="reduce-overhead": the step replayed as one graph',
                                 compile_mode="reduce-overhead")
    graphs_why = (None if info.type == "cuda" else
                  f"CUDA graphs record a CUDA device's kernels; {info.type} has none to record")
    best = graphs if graphs_why is None else compiled
    bigger = dataclasses.replace(best, name=f"AMP {name} + batch x{BATCH_SCALE}",
                                 change=f"{BATCH_SCALE}x the tokens per step: larger matmuls",
                                 batch_scale=BATCH_SCALE)
    rungs: list[tuple[Rung, str | None]] = [
        (Rung("fp32", "the baseline"), None),
        (Rung(f"AMP {name}", "autocast" + (" + GradScaler" if info.needs_grad_scaler(amp)
                                           else ""), amp), None),
        (fused, None), (compiled, None), (graphs, graphs_why), (bigger, None)]
    others = [d for d in (torch.bfloat16, torch.float16) if d != amp]
    for other in others:
        why = None if other in info.amp_dtypes else f"{dtype_name(other)} is not offered here"
        rungs.append((dataclasses.replace(bigger, name=f"AMP {dtype_name(other)} + batch "
                                          f"x{BATCH_SCALE}", change=f"{dtype_name(other)} "
                                          f"instead of {name}", amp_dtype=other), why))
    why_bf16 = None if torch.bfloat16 in info.amp_dtypes else "bf16 is not offered here"
    rungs.append((dataclasses.replace(bigger, name=f"pure bf16 + batch x{BATCH_SCALE}",
                                      change="weights and optimizer state in bf16, no autocast",
                                      amp_dtype=None, pure_bf16=True), why_bf16))
    return rungs


@dataclass
class RungResult:
    """What one rung measured (``timing`` None where it did not run: ``skipped`` says why)."""

    rung: Rung
    tokens: int
    timing: Timing | None = None
    utilization: Utilization | None = None
    shares: TimeShares | None = None
    final_loss: float | None = None
    skipped: str | None = None
    # against the first rung (fp32), from steps that took turns (``compare_rungs``); None where
    # the rung was not compared that way (the first, a compiled rung, a larger batch)
    comparison: PairedComparison | None = None
    matmul_flops: int | None = None  # the weights' matmuls' share of the model FLOPs

    @property
    def matmul_tflops(self) -> float | None:
        """The rate the step's own matmuls ran at: their FLOPs over the profile's matmul time
        per step (None where the rung was not profiled). Read against the measured matmul rate,
        it says whether a step falls short of that rate in its matmuls or around them."""
        if self.matmul_flops is None or self.shares is None or not self.shares.seconds["matmul"]:
            return None
        return self.matmul_flops / self.shares.seconds["matmul"] / 1e12

    @property
    def matmul_of_rate(self) -> float | None:
        """``matmul_tflops`` over this device's measured matmul rate of the rung's dtype."""
        rate = self.utilization.matmul_tflops if self.utilization else None
        return None if rate is None or self.matmul_tflops is None else self.matmul_tflops / rate

    def table_row(self) -> dict[str, object]:
        """The row the ladder's table shows: rung, change, tokens, time, rate and the limits."""
        row: dict[str, object] = {"rung": self.rung.name, "what it changed": self.rung.change,
                                  "tokens/step": self.tokens}
        if self.timing is None or self.utilization is None:
            return row | {"ms/step (IQR)": self.skipped or "-"}
        t, u = self.timing, self.utilization
        return row | {"ms/step (IQR)": f"{t.median * 1e3:.2f} ({t.iqr * 1e3:.2f})"
                      + (" NOISY" if t.noisy else ""),
                      "TFLOP/s": f"{u.tflops:.3g}", "MFU": percent(u.mfu),
                      "of matmul": percent(u.of_matmul),
                      "its matmuls, of the rate": percent(self.matmul_of_rate),
                      "final loss": f"{self.final_loss:.4g}"}

    def as_dict(self) -> dict[str, object]:
        rung = dataclasses.asdict(self.rung)
        rung["amp_dtype"] = dtype_name(self.rung.amp_dtype) if self.rung.amp_dtype else None
        out: dict[str, object] = {**rung, "tokens": self.tokens, "skipped": self.skipped,
                                  "final_loss": self.final_loss}
        if self.timing is not None:
            out |= {"median_s": self.timing.median, "iqr_s": self.timing.iqr,
                    "steps": len(self.timing.samples), "noisy": self.timing.noisy,
                    "wait_share": self.timing.wait_share}
        if self.comparison is not None:
            c = self.comparison
            out |= {"vs_first": {"speedup": c.ratio, "low": c.estimate.low,
                                 "high": c.estimate.high, "blocks": c.estimate.blocks,
                                 "control": c.control.median, "basis": c.basis,
                                 "stated": c.stated, "why_not_stated": c.noise}}
        if self.utilization is not None:
            out |= self.utilization.as_dict()
        if self.shares is not None:
            out |= {"time_shares": self.shares.shares, "shares_from": self.shares.source,
                    "top_s_per_step": self.shares.top, "step_matmul_tflops": self.matmul_tflops,
                    "step_matmul_of_matmul": self.matmul_of_rate}
        return out


def with_width(sizes: TransformerSizes, width: int) -> TransformerSizes:
    """``sizes`` with the model ``width`` wide, in heads of 64 channels (the sweep's rule): the
    ladder at a width where matmuls dominate (``pdm run ladder --width 2048``)."""
    if width < 64 or width % 64:
        raise ValueError(f"width {width}: give a multiple of 64 (heads of 64 channels)")
    return dataclasses.replace(sizes, d_model=width, n_heads=width // 64)


def _config(sizes: TransformerSizes, d_model: int | None = None) -> TransformerConfig:
    width = d_model or sizes.d_model
    heads = sizes.n_heads if d_model is None else max(1, width // 64)
    return TransformerConfig(sizes.n_symbols + 1, sizes.seq_len, width, sizes.n_layers, heads)


def why_no_matmul_rate(ceiling: Ceiling | None, compute: str) -> str | None:
    """None where ``compute`` ("fp32", "tf32", "bf16", "fp16") has a measured matmul rate to
    read a step against; else, in words, why it has none."""
    measured = "fp32" if compute == "tf32" else compute
    if ceiling is None:
        return "no matmul rate was measured"
    if measured in ceiling.emulated:  # an emulated matmul bounds no model's step
        return f"{measured} is emulated on this device: its matmul rate bounds no step"
    if measured not in ["fp32", *ceiling.low_dtypes]:
        return f"no {measured} matmul rate was measured here"
    return None


def matmul_rate_tflops(ceiling: Ceiling | None, compute: str) -> float | None:
    """The measured matmul rate of ``compute`` ("fp32", "tf32", "bf16", "fp16") in TFLOP/s, None
    where ``why_no_matmul_rate`` gives a reason."""
    if why_no_matmul_rate(ceiling, compute) is not None:
        return None
    return ceiling.best_gflops("fp32" if compute == "tf32" else compute) / 1e3


def build_step(info: DeviceInfo, sizes: TransformerSizes, rung: Rung, d_model: int | None = None
               ) -> tuple[Callable[[int], float], list[tuple[torch.Tensor, torch.Tensor]]]:
    """A fresh transformer seeded ``SEED``, in ``rung``'s configuration, and its training step
    (``step(i)`` trains on batch ``i`` of 8, cycled), with the batches."""
    config = _config(sizes, d_model)
    torch.manual_seed(SEED)
    batches = ReversalTask(sizes.n_symbols, sizes.seq_len).batches(
        8, sizes.batch * rung.batch_scale, SEED, info.device)
    model = DecoderTransformer(config).to(info.device)
    if rung.pure_bf16:
        model = model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sizes.lr, fused=rung.fused or None)
    scaler = torch.amp.GradScaler(info.type, enabled=bool(
        rung.amp_dtype and info.needs_grad_scaler(rung.amp_dtype)))
    net = model if rung.compile_mode is None else torch.compile(model, mode=rung.compile_mode)
    return make_sequence_train_step(net, optimizer, batches, rung.amp_dtype, scaler), batches


def compare_rungs(info: DeviceInfo, sizes: TransformerSizes, rows: Sequence[RungResult],
                  blocks: int = BLOCKS, preset: str = "", progress: bool = False
                  ) -> dict[str, PairedComparison]:
    """Every eager rung of ``rows`` that ran at the first rung's tokens per step, against that
    first rung (fp32), from steps that take turns (``interleave``: palindromic blocks, a second
    fp32 model as the A/A control), so a load that comes or goes meets every rung alike. The
    models are built again, fresh; compiled rungs and larger batches are left out (a compiled
    rung's graphs belong to the compile cache it was built in; a larger batch does other work,
    compared by its rate). Empty where fewer than two such rungs ran."""
    first = rows[0] if rows else None
    if first is None or first.timing is None:
        return {}
    same = [r.rung for r in rows if r.timing is not None and r.rung.compile_mode is None
            and r.tokens == first.tokens]
    if len(same) < 2:
        return {}
    runs: dict[str, Callable[[], object]] = {}
    for name, rung in [(r.name, r) for r in same] + [(CONTROL, first.rung)]:
        step, _ = build_step(info, sizes, rung)
        runs[name] = numbered(step)
    try:
        timed = interleave(runs, first.rung.name, CONTROL, info.device, blocks, preset=preset,
                           progress=progress)
    finally:
        runs.clear()
        free_memory(info.device)
    return {r.name: timed.comparison(r.name) for r in same[1:]}


def run_step(info: DeviceInfo, sizes: TransformerSizes, rung: Rung, ceiling: Ceiling | None,
             max_steps: int = 30, budget_s: float = 3.0, profile: bool = True,
             d_model: int | None = None, progress: bool = False) -> RungResult:
    """Train a fresh, identically seeded transformer in ``rung``'s configuration: ``WARMUP``
    untimed steps, then up to ``max_steps`` timed ones (at least 3, stopping once ``budget_s``
    seconds are spent), then 3 profiled steps."""
    config = _config(sizes, d_model)
    tokens = sizes.batch * rung.batch_scale * sizes.seq_len
    result = RungResult(rung, tokens)
    step, batches = build_step(info, sizes, rung, d_model)
    timing, losses = time_steps(step, max_steps, info.device, WARMUP, desc=rung.name,
                                progress=progress, budget_s=budget_s)
    result.timing, result.final_loss = timing, float(losses[-1])
    if profile:
        result.shares = time_shares(profile_steps(step, info.device, steps=3, warmup=0))
    compute = compute_dtype(rung.compute, tf32="matmuls" in tf32_in_use(info))
    peak = peak_for(info.name, info.type)
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        return DecoderTransformer(config), tuple(torch.zeros(t.shape, dtype=t.dtype)
                                                 for t in batches[0])

    def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return sequence_loss(m(x), y)

    counts = op_flops(build, loss)
    flops = sum(counts.values())
    result.matmul_flops = sum(counts.get(op, 0) for op in WEIGHT_MATMULS)
    result.utilization = Utilization(flops, timing.median,
                                     peak.tflops.get(compute) if peak else None,
                                     matmul_rate_tflops(ceiling, compute))
    return result


def run_ladder(info: DeviceInfo, sizes: TransformerSizes, ceiling: Ceiling | None,
               deadline: float | None = None, on_row: Callable[[RungResult], None] | None = None,
               compiled: bool = True, blocks: int = BLOCKS, preset: str = "",
               **options: object) -> list[RungResult]:
    """Every rung of ``ladder_rungs`` in order. A rung that does not apply, one that fails
    (its error's last line), one not started before ``deadline`` (``time.monotonic()``) and,
    with ``compiled=False``, the compile and CUDA-graph rungs are rows with ``skipped`` set (the
    rungs built on them, a larger batch, the other dtype, pure bf16, then run eager); ``on_row``
    sees each row as it is done. Each compiled rung compiles cold, in an empty cache of its own
    (``measure.fresh_compile_cache``): no graph compiled for another rung is reused. Then, before
    ``deadline``, the eager rungs at fp32's tokens are compared with it in ``blocks`` interleaved
    blocks (``compare_rungs``, ``preset`` naming the sizes: none is stated at ``smoke``), each
    row's ``comparison``: the rungs ran one after another, and a load that came or went
    meanwhile moved some and not others."""
    rows = []
    for rung, why in ladder_rungs(info):
        tokens = sizes.batch * rung.batch_scale * sizes.seq_len
        if why is None and rung.compile_mode and not compiled:
            if rung.batch_scale == 1:
                why = "left out here (compiled=False): pdm run ladder runs it"
            else:
                rung = dataclasses.replace(rung, compile_mode=None, fused=True,
                                           change=rung.change + " (eager here)")
        if why is None and deadline is not None and time.monotonic() > deadline:
            why = "not reached: the time given to the ladder was spent"
        if why is not None:
            row = RungResult(rung, tokens, skipped=why)
        else:
            try:
                with fresh_compile_cache() if rung.compile_mode else nullcontext():
                    row = run_step(info, sizes, rung, ceiling, **options)
            except Exception as err:  # a rung that fails is a row that says why; others run
                row = RungResult(rung, tokens, skipped="failed: " + _last_line(err))
            finally:
                torch.compiler.reset()
                free_memory(info.device)
        rows.append(row)
        if on_row:
            on_row(row)
    if deadline is None or time.monotonic() <= deadline:
        compared = compare_rungs(info, sizes, rows, blocks, preset,
                                 progress=bool(options.get("progress")))
        for row in rows:
            row.comparison = compared.get(row.rung.name)
    return rows


def _last_line(err: Exception) -> str:
    lines = [line for line in traceback.format_exception_only(err)[-1].splitlines() if line]
    return lines[-1][:300] if lines else type(err).__name__


@dataclass
class SweepRow:
    """fp32 or AMP at one width and tokens per step."""

    d_model: int
    tokens: int
    mode: str
    result: RungResult


def sweep(info: DeviceInfo, sizes: TransformerSizes, ceiling: Ceiling | None,
          widths: Sequence[int], batch_scales: Sequence[int] = (1, BATCH_SCALE),
          deadline: float | None = None, **options: object) -> list[SweepRow]:
    """fp32 and plain AMP (eager, the default AdamW) at each width (heads of 64 channels) and
    tokens per step (``batch_scales`` times the preset's batch)."""
    rows = []
    amp = info.amp_dtype
    modes = [Rung("fp32", "baseline")] + ([Rung(f"AMP {dtype_name(amp)}", "autocast", amp)]
                                          if amp else [])
    for width in widths:
        for scale in batch_scales:
            for rung in modes:
                rung = dataclasses.replace(rung, batch_scale=scale)
                tokens = sizes.batch * scale * sizes.seq_len
                if deadline is not None and time.monotonic() > deadline:
                    result = RungResult(rung, tokens, skipped="not reached: time spent")
                else:
                    try:
                        result = run_step(info, sizes, rung, ceiling, profile=False,
                                          d_model=width, **options)
                    except Exception as err:
                        result = RungResult(rung, tokens, skipped="failed: " + _last_line(err))
                    finally:
                        free_memory(info.device)
                rows.append(SweepRow(width, tokens, rung.name, result))
    return rows


def sweep_widths(preset_name: str) -> tuple[int, ...]:
    """Widths to sweep at a preset: from a quarter of its transformer's width to four times."""
    return {"paper": (256, 512, 1024, 2048), "cpu": (128, 256, 512, 1024),
            "small": (64, 128, 256, 512), "smoke": (32, 64, 128)}[preset_name]


def amp_pays_from(rows: Sequence[SweepRow], tokens: int) -> int | None:
    """The smallest width at ``tokens`` per step from which AMP's median step is faster than
    fp32's at every larger width (None if it never is)."""
    widths = sorted({r.d_model for r in rows if r.tokens == tokens})
    faster = []
    for width in widths:
        pair = {r.mode.split()[0]: r.result for r in rows
                if r.d_model == width and r.tokens == tokens}
        fp32, amp = pair.get("fp32"), pair.get("AMP")
        if fp32 is None or amp is None or fp32.timing is None or amp.timing is None:
            return None
        faster.append(amp.timing.median < fp32.timing.median)
    for i, width in enumerate(widths):
        if all(faster[i:]):
            return width
    return None


def ladder_report(info: DeviceInfo, ceiling: Ceiling | None,
                  ladder: Sequence[RungResult] = (), sweep_rows: Sequence[SweepRow] = ()
                  ) -> dict[str, object]:
    """What a ladder run measured, as plain numbers (``pdm run ladder --json`` writes it;
    ``ladder_figures`` draws it)."""
    peak = peak_for(info.name, info.type)
    report: dict[str, object] = {
        "device": str(info.device), "device_name": info.name, "backend": info.backend,
        "torch": torch.__version__,
        "peak": None if peak is None else {"name": peak.name, "tflops": peak.tflops,
                                           "source": peak.source},
        "ceiling": None if ceiling is None else ceiling.as_dict(), "mfu_goal": MFU_GOAL}
    if ladder:
        tf32 = "matmuls" in tf32_in_use(info)
        report["ladder"] = [r.as_dict() | _why_unmeasured(r, info, peak, ceiling, tf32)
                            for r in ladder]
    if sweep_rows:
        report["sweep"] = [{"d_model": r.d_model, "tokens": r.tokens, "mode": r.mode,
                            **r.result.as_dict()} for r in sweep_rows]
        tokens = sorted({r.tokens for r in sweep_rows})
        report["amp_pays_from_width"] = {str(t): amp_pays_from(sweep_rows, t) for t in tokens}
    return report


def _why_unmeasured(result: RungResult, info: DeviceInfo, peak: Peak | None,
                    ceiling: Ceiling | None, tf32: bool) -> dict[str, str]:
    """For a rung that ran: why it has no MFU (``why_no_mfu``) or no share of the matmul rate
    (``why_no_of_matmul``), in words; the keys whose measure is known are left out."""
    if result.utilization is None:  # not run: ``skipped`` says why
        return {}
    compute = compute_dtype(result.rung.compute, tf32)
    why: dict[str, str] = {}
    if result.utilization.mfu is None:
        why["why_no_mfu"] = (
            f"{peak.name} lists no {compute} peak" if peak is not None else
            "a CPU has no datasheet peak" if info.type == "cpu" else
            f"no datasheet peak is listed for {info.name}")
    if result.utilization.of_matmul is None:
        why["why_no_of_matmul"] = (why_no_matmul_rate(ceiling, compute)
                                   or f"no {compute} matmul rate")
    return why


def _not_drawn(rows: Sequence[dict], key: str, measure: str) -> list[tuple[str, str]]:
    """(rung, why) for each rung of a report's ladder that has no ``key`` to draw: the reason it
    was skipped, else why its measure is unknown (``ladder_report``'s ``why_no_<key>``)."""
    return [(r["name"], r.get("skipped") or r.get(f"why_no_{key}") or f"no {measure}")
            for r in rows if not r.get(key)]


def ladder_figures(report: dict) -> dict[str, object]:
    """The figures of a ladder report (the dict ``pdm run ladder --json`` writes): "ladder" (each
    rung's MFU, or its share of the matmul rate where the device has no known peak, with the
    quartile spread; a rung without one, skipped or unmeasured, is named under the bars with the
    report's reason, and the title counts the rungs drawn), "time-shares" (each rung's step by
    group) and "sweep"."""
    from amp_tutorial.plots import plot_sweep, plot_time_shares, plot_utilization

    peak = report.get("peak")
    key, measure = (("mfu", "MFU (of the datasheet peak)") if peak else
                    ("of_matmul", "share of the measured matmul rate"))
    device = report.get("device_name", "")
    figures: dict[str, object] = {}
    rungs = report.get("ladder", [])
    ran = [r for r in rungs if r.get(key)]
    if rungs:  # every rung is drawn, or named under the figure with why it is not
        def label(r: dict) -> str:
            return f"{r['name']} (of {r['peak_tflops']:g} TFLOP/s)" if peak else r["name"]

        missing = _not_drawn(rungs, key, measure)
        title = f"The ladder on {device}" + (f": {len(ran)} of {len(rungs)} rungs drawn"
                                             if missing else "")
        figures["ladder"] = plot_utilization(
            [(label(r), r[key], r[key] * r["iqr_s"] / r["median_s"]) for r in ran], measure,
            title, MFU_GOAL if peak else None, missing=missing,
            noisy={label(r): why_noisy(r["iqr_s"] / r["median_s"], r.get("wait_share"))
                   or "its timing is noisy" for r in ran if r.get("noisy")})
    shares = {r["name"]: r["time_shares"] for r in rungs
              if r.get("time_shares")}  # every profiled rung, with a limit to read it by or not
    if shares:  # a rung skipped or not profiled is named under the bars, with why
        figures["time-shares"] = plot_time_shares(
            shares, f"Where the step's time goes, {device}",
            missing=[(r["name"], r.get("skipped") or "not profiled") for r in rungs
                     if not r.get("time_shares")])
    curves: dict[str, dict[int, tuple[float, float]]] = {}
    for r in report.get("sweep", []):
        if r.get(key):
            curves.setdefault(f"{r['mode']}, {r['tokens']} tokens", {})[r["d_model"]] = (
                r[key], r["median_s"])
    if curves:
        figures["sweep"] = plot_sweep(curves, f"fp32 and AMP over the model's width, {device}",
                                      measure)
    return figures
