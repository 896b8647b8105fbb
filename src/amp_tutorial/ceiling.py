"""What the hardware allows: the matmul speed of each AMP dtype against fp32, measured live.

A square n x n matmul does n multiply-adds for each of its n² outputs: 2n³ floating-point
operations. Timed per call (device synchronised, warm-up untimed, median and interquartile range,
``measure.StepTimer``), that gives GFLOP/s per dtype, and ``t_fp32 / t_low`` is the fastest a
matmul-bound step can get from the low-precision dtype on this device: the *ceiling* a model's AMP
gain is read against. The rest of a step (elementwise ops, casts, the optimizer) gains less.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from amp_tutorial.device import DeviceInfo, dtype_name
from amp_tutorial.measure import StepTimer, Timing

# Two sizes per preset: big enough to reach the device's matmul rate, small enough to finish in
# seconds. At `small` (a CPU that emulates bf16, ~0.7 GFLOP/s) a 2048² bf16 matmul takes 25 s.
# `smoke` measures as `small` does: at 64² and 128² the call overhead swamped the matmul (a run
# printed a 60x "ceiling"), and 512² costs a native CPU milliseconds.
SIZES = {"paper": (4096, 8192), "cpu": (1024, 2048), "small": (256, 512), "smoke": (256, 512)}


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


def matmul_rate(n: int, dtype: torch.dtype, device: torch.device | str, steps: int = 20,
                warmup: int = 3, budget_s: float = 2.0) -> MatmulRate:
    """Time ``a @ b`` for random n x n ``dtype`` matrices: ``warmup`` untimed calls, then up to
    ``steps`` timed ones, stopping early (after at least 3) once ``budget_s`` seconds are spent.
    """
    generator = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(device, dtype) for _ in range(2))
    timer = StepTimer(device, warmup=warmup)
    # fp32 as the fp32 baseline computes: on CUDA its convolutions run in TF32 by default
    # (cudnn.allow_tf32) while matmuls do not (cuda.matmul.allow_tf32), so time the matmul as the
    # convolutions run, or an Ampere+ GPU's "ceiling" compares bf16 with IEEE fp32
    previous = torch.backends.cuda.matmul.allow_tf32
    if torch.device(device).type == "cuda" and dtype == torch.float32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    try:
        start = time.perf_counter()
        while timer.steps_seen < warmup + steps:
            with timer.step():
                a @ b
            if len(timer.samples) >= 3 and time.perf_counter() - start > budget_s:
                break
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return MatmulRate(n, dtype_name(dtype), timer.timing)


def ceiling_dtypes(info: DeviceInfo) -> tuple[list[torch.dtype], list[str]]:
    """The low-precision dtypes whose matmul to measure on this device, and notes on any left out.

    The device's AMP dtypes, plus fp16 on a CPU whose oneDNN has fp16 kernels
    (``torch.ops.mkldnn._is_mkldnn_fp16_supported``: avx512_fp16 or AMX-FP16). Without them a CPU
    fp16 matmul is emulated in ATen's reference gemm, and is left out.
    """
    dtypes = list(info.amp_dtypes)
    notes = []
    if info.type == "cpu" and torch.float16 not in dtypes:
        try:
            fp16_kernels = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except (AttributeError, RuntimeError):
            fp16_kernels = False
        if fp16_kernels:
            dtypes.append(torch.float16)
        else:
            notes.append("fp16: not measured, emulated on this CPU (oneDNN has no fp16 kernels "
                         "for it; ATen's reference gemm runs instead)")
    return dtypes, notes


@dataclass(frozen=True)
class Ceiling:
    """fp32 and low-precision matmul rates at each size, with the ratios they give."""

    rates: tuple[MatmulRate, ...]
    notes: tuple[str, ...] = ()

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
        """The highest ratio over the measured sizes: the most a matmul-bound step can gain."""
        return max(self.ratio(n, dtype) for n in self.sizes)

    def as_dict(self) -> dict[str, object]:
        """Plain numbers for JSON: each rate with its spread, and each ratio."""
        return {
            "rates": [{"n": r.n, "dtype": r.dtype, "gflops": r.gflops,
                       "gflops_q3_q1": list(r.gflops_range), "median_s": r.timing.median,
                       "iqr_s": r.timing.iqr, "calls": len(r.timing.samples)}
                      for r in self.rates],
            "ratios": {d: {str(n): self.ratio(n, d) for n in self.sizes}
                       for d in self.low_dtypes},
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """One line per size: each dtype's GFLOP/s (median, quartile range) and its ratio."""
        out = []
        for n in self.sizes:
            parts = []
            for dtype in ["fp32", *self.low_dtypes]:
                r = self.rate(n, dtype)
                low, high = r.gflops_range
                ratio = "" if dtype == "fp32" else f", {self.ratio(n, dtype):.2f}x fp32"
                parts.append(f"{dtype} {r.gflops:.0f} ({low:.0f}-{high:.0f}){ratio}")
            out.append(f"matmul {n}x{n}: " + "; ".join(parts))
        return out + list(self.notes)


def matmul_ceiling(info: DeviceInfo, sizes: tuple[int, ...] = SIZES["cpu"],
                   **rate_options: float) -> Ceiling:
    """fp32 and every low-precision dtype's matmul rate at each size, measured now on
    ``info.device``, interleaved size by size so the ratios come from the same minutes."""
    dtypes, notes = ceiling_dtypes(info)
    rates = [matmul_rate(n, dtype, info.device, **rate_options)
             for n in sizes for dtype in (torch.float32, *dtypes)]
    return Ceiling(tuple(rates), tuple(notes))
