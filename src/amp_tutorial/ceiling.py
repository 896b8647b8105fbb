"""What the hardware allows: the matmul speed of each AMP dtype against fp32, measured live.

A square n x n matmul does n multiply-adds for each of its n² outputs: 2n³ floating-point
operations. Timed per call (device synchronised, warm-up untimed, median and interquartile range,
``measure.StepTimer``), that gives GFLOP/s per dtype, and ``t_fp32 / t_low`` is the fastest a
matmul-bound step can get from the low-precision dtype on this device: the *ceiling* a model's AMP
gain is read against. The rest of a step (elementwise ops, casts, the optimizer) gains less.

Two cases where the ratio is no ceiling, and the report says so instead of calling it one: a CPU
that emulates bf16 (there the timed ``a @ b`` and a model's convolutions take different slow
paths, so a model can beat the figure), and timings whose spread is a large share of their median
(a busy machine), where the ratio is noise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from amp_tutorial.device import DeviceInfo, dtype_name, has_fp32_precision_api, tf32_in_use
from amp_tutorial.measure import StepTimer, Timing

# Two sizes per preset: big enough to reach the device's matmul rate, small enough to finish in
# seconds. At `small` (a CPU that emulates bf16, ~0.7 GFLOP/s) a 2048² bf16 matmul takes 25 s.
# `smoke` measures as `small` does: at 64² and 128² the call overhead swamped the matmul (a run
# printed a 60x "ceiling"), and 512² costs a native CPU milliseconds.
SIZES = {"paper": (4096, 8192), "cpu": (1024, 2048), "small": (256, 512), "smoke": (256, 512)}
# What each course model's fp32 baseline spends its time in, so its fp32 matmul row runs as that
# baseline does on CUDA: TF32 for convolutions (cuDNN's default), IEEE fp32 for matmuls (cuBLAS's)
FP32_LIKE = {"conv": "convolutions", "transformer": "matmuls"}


def matmul_flops(n: int) -> int:
    """Floating-point operations of one n x n @ n x n matmul: n³ multiply-adds, 2 FLOPs each."""
    return 2 * n**3


@dataclass(frozen=True)
class MatmulRate:
    """One dtype's matmul speed at one size: per-call times and the GFLOP/s they give."""

    n: int
    dtype: str
    timing: Timing

    @property
    def gflops(self) -> float:
        """GFLOP/s at the median call time."""
        return matmul_flops(self.n) / self.timing.median / 1e9

    @property
    def gflops_range(self) -> tuple[float, float]:
        """GFLOP/s at the slower and the faster quartile of call times (the spread)."""
        return (matmul_flops(self.n) / self.timing.q3 / 1e9,
                matmul_flops(self.n) / self.timing.q1 / 1e9)

    @property
    def spread(self) -> float:
        """The interquartile range of the call times as a share of their median."""
        return self.timing.spread

    @property
    def noisy(self) -> bool:
        """True when the median says little: a wide spread, or calls crowded off their CPUs
        (``measure.Timing.why_noisy``)."""
        return self.timing.noisy


@contextmanager
def cuda_matmul_tf32(allow: bool) -> Iterator[None]:
    """Let CUDA's fp32 matmuls use TF32 (or not) inside the block, and restore the setting after.

    Read and written with the API this torch has: from torch 2.9 ``cuda.matmul.fp32_precision``,
    put back exactly on the way out. Inside the block only the new setting moves, so a legacy
    getter (``matmul.allow_tf32``) may refuse to answer there ("a mix of the legacy and new
    APIs", ``Context::allowTF32CuBLAS``); only the timed ``a @ b`` runs inside (so on an H100
    with torch 2.11: register row ``ceiling-tf32``). Needs no GPU.
    """
    matmul = torch.backends.cuda.matmul
    if has_fp32_precision_api():
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if allow else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
        return
    previous = matmul.allow_tf32
    matmul.allow_tf32 = allow
    try:
        yield
    finally:
        matmul.allow_tf32 = previous


def matmul_rate(n: int, dtype: torch.dtype, device: torch.device | str, steps: int = 20,
                warmup: int = 3, budget_s: float = 2.0, tf32: bool = False) -> MatmulRate:
    """Time ``a @ b`` for random n x n ``dtype`` matrices: ``warmup`` untimed calls, then up to
    ``steps`` timed ones, stopping early (after at least 3) once ``budget_s`` seconds are spent.
    ``tf32``: a CUDA fp32 matmul runs in TF32, as a baseline whose TF32 is on computes.
    """
    generator = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(device, dtype) for _ in range(2))
    timer = StepTimer(device, warmup=warmup)
    on_cuda = torch.device(device).type == "cuda" and dtype == torch.float32
    with cuda_matmul_tf32(tf32) if on_cuda else nullcontext():
        start = time.perf_counter()
        while timer.steps_seen < warmup + steps:
            with timer.step():
                a @ b
            if len(timer.samples) >= 3 and time.perf_counter() - start > budget_s:
                break
    return MatmulRate(n, dtype_name(dtype), timer.timing)


def cpu_fp16_kernels() -> bool:
    """Whether oneDNN has fp16 kernels for this CPU (avx512_fp16 or AMX-FP16); without them a CPU
    fp16 matmul runs ATen's reference gemm: emulated."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


def ceiling_dtypes(info: DeviceInfo) -> tuple[list[torch.dtype], list[str]]:
    """The low-precision dtypes whose matmul to measure on this device, and notes on any left out.

    The device's AMP dtypes, plus fp16 on a CPU whose oneDNN has fp16 kernels
    (``torch.ops.mkldnn._is_mkldnn_fp16_supported``: avx512_fp16 or AMX-FP16). Without them a CPU
    fp16 matmul is emulated in ATen's reference gemm, and is left out.
    """
    dtypes = list(info.amp_dtypes)
    notes = []
    if info.type == "cpu" and torch.float16 not in dtypes:
        if cpu_fp16_kernels():
            dtypes.append(torch.float16)
        else:
            notes.append("fp16: not measured, emulated on this CPU (oneDNN has no fp16 kernels "
                         "for it; ATen's reference gemm runs instead)")
    return dtypes, notes


@dataclass(frozen=True)
class Ceiling:
    """fp32 and low-precision matmul rates at each size, with the ratios they give.

    ``emulated``: the low dtypes this device only emulates (bf16 on a CPU without its
    instructions), whose ratio is how a plain matmul fares there and bounds no model's gain.
    """

    rates: tuple[MatmulRate, ...]
    notes: tuple[str, ...] = ()
    emulated: tuple[str, ...] = ()

    def rate(self, n: int, dtype: str) -> MatmulRate:
        return next(r for r in self.rates if r.n == n and r.dtype == dtype)

    @property
    def sizes(self) -> list[int]:
        return sorted({r.n for r in self.rates})

    @property
    def low_dtypes(self) -> list[str]:
        return list(dict.fromkeys(r.dtype for r in self.rates if r.dtype != "fp32"))

    def ratio(self, n: int, dtype: str) -> float:
        """The speedup of a ``dtype`` matmul over fp32 at size n: t_fp32 / t_dtype (medians)."""
        return self.rate(n, "fp32").timing.median / self.rate(n, dtype).timing.median

    def best_ratio(self, dtype: str) -> float:
        """The highest ratio over the measured sizes, noisy or not."""
        return max(self.ratio(n, dtype) for n in self.sizes)

    def quiet_sizes(self, dtype: str) -> list[int]:
        """The sizes where neither the fp32 nor the ``dtype`` rate is noise."""
        return [n for n in self.sizes
                if not (self.rate(n, "fp32").noisy or self.rate(n, dtype).noisy)]

    def best_gflops(self, dtype: str) -> float:
        """The fastest median rate of a ``dtype`` matmul over the sizes whose timings are not
        noise (over all sizes where every one is): what a matmul-only step could reach here."""
        quiet = [n for n in self.sizes if not self.rate(n, dtype).noisy] or self.sizes
        return max(self.rate(n, dtype).gflops for n in quiet)

    def why_no_ceiling(self, dtype: str) -> str | None:
        """None where the ratio is a ceiling for ``dtype``; else, in words, why it is not one."""
        if dtype in self.emulated:
            return (f"{dtype} is emulated on this device, so the timed matmul and a model's "
                    "convolutions take different slow paths and a model can beat the figure")
        if not self.quiet_sizes(dtype):
            why = next(r.timing.why_noisy for n in self.sizes for d in ("fp32", dtype)
                       if (r := self.rate(n, d)).noisy)
            return (f"the matmul timings were noise (a rate's {why}; a busy machine?): "
                    "measure again when it is quiet")
        return None

    def ceiling(self, dtype: str) -> float | None:
        """The most a matmul-bound step can gain from ``dtype`` here: the best ratio over the
        sizes whose timings are not noise; None where ``why_no_ceiling`` gives a reason."""
        if self.why_no_ceiling(dtype):
            return None
        return max(self.ratio(n, dtype) for n in self.quiet_sizes(dtype))

    def describe(self, dtype: str, gain: float | None = None) -> str:
        """The words after a model's gain: "of a 2.20x matmul ceiling (93%)", or what the ratio
        is where it is not a ceiling."""
        top = self.ceiling(dtype)
        if top is None:
            quiet = self.quiet_sizes(dtype)  # a ratio only from rates that are not noise
            if not quiet:
                return f"no matmul ceiling ({self.why_no_ceiling(dtype)})"
            ratio = max(self.ratio(n, dtype) for n in quiet)
            return (f"no matmul ceiling ({dtype} matmul {ratio:.2f}x fp32 here, but "
                    f"{self.why_no_ceiling(dtype)})")
        share = f" ({gain / top:.0%})" if gain is not None else ""
        return f"of a {top:.2f}x matmul ceiling{share}"

    def as_dict(self) -> dict[str, object]:
        """Plain numbers for JSON: each rate with its spread, each ratio and each ceiling."""
        return {
            "rates": [{"n": r.n, "dtype": r.dtype, "gflops": r.gflops,
                       "gflops_q3_q1": list(r.gflops_range), "median_s": r.timing.median,
                       "iqr_s": r.timing.iqr, "calls": len(r.timing.samples), "noisy": r.noisy,
                       "wait_share": r.timing.wait_share}
                      for r in self.rates],
            "ratios": {d: {str(n): self.ratio(n, d) for n in self.sizes}
                       for d in self.low_dtypes},
            "ceilings": {d: self.ceiling(d) for d in self.low_dtypes},
            "not_a_ceiling": {d: why for d in self.low_dtypes
                              if (why := self.why_no_ceiling(d))},
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """One line per size: each dtype's GFLOP/s (median, quartile range; three significant
        digits, as an emulated dtype runs below 1) and its ratio to fp32; a noisy rate is marked
        so, and no ratio is printed where either rate is noisy."""
        out = []
        for n in self.sizes:
            parts = []
            base = self.rate(n, "fp32")
            for dtype in ["fp32", *self.low_dtypes]:
                r = self.rate(n, dtype)
                low, high = r.gflops_range
                ratio = ("" if dtype == "fp32" or r.noisy or base.noisy
                         else f", {self.ratio(n, dtype):.2f}x fp32")
                noise = f", NOISY: {r.timing.why_noisy}" if r.noisy else ""
                parts.append(f"{dtype} {r.gflops:.3g} GFLOP/s ({low:.3g}-{high:.3g}{noise})"
                             f"{ratio}")
            out.append(f"matmul {n}x{n}: " + "; ".join(parts))
        return out + list(self.notes)


def matmul_ceiling(info: DeviceInfo, sizes: tuple[int, ...] = SIZES["cpu"],
                   fp32_like: str = "convolutions", **rate_options: float) -> Ceiling:
    """fp32 and every low-precision dtype's matmul rate at each size, measured now on
    ``info.device``, interleaved size by size so the ratios come from the same minutes.

    ``fp32_like``: what the model's fp32 baseline spends its time in ("convolutions" or
    "matmuls", ``FP32_LIKE``); the fp32 matmul uses TF32 exactly where that kind of op does now
    (``device.tf32_in_use``: on NVIDIA Ampere and newer, by default convolutions do, matmuls do
    not; never on ROCm, an older NVIDIA GPU or another device, whatever the flags say).
    """
    dtypes, notes = ceiling_dtypes(info)
    tf32 = fp32_like in tf32_in_use(info)
    if tf32:
        notes.append(f"fp32: matmuls timed with TF32, as this model's fp32 {fp32_like} run "
                     "on this GPU")
    emulated = ("bf16",) if info.type == "cpu" and info.native_bf16 is False else ()
    if info.type == "cpu" and torch.float16 in dtypes and not cpu_fp16_kernels():
        emulated += ("fp16",)  # AMP_TUTORIAL_DTYPE=float16 on a CPU without oneDNN's fp16
    rates = [matmul_rate(n, dtype, info.device, tf32=tf32, **rate_options)
             for n in sizes for dtype in (torch.float32, *dtypes)]
    return Ceiling(tuple(rates), tuple(notes), emulated)
