"""Which scaled-dot-product-attention kernel ran, read off the running device.

``F.scaled_dot_product_attention`` picks a backend at run time (flash, memory-efficient, cuDNN,
math) from the device, the dtype and the inputs. The profiler names the kernel that ran;
``torch.nn.attention.sdpa_kernel`` restricts the choice, and raises when none of the allowed
backends can run. ``attention_cost`` measures what a backend costs in time and memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from amp_tutorial.measure import (
    peak_memory_bytes,
    reset_peak_memory,
    saved_bytes,
    time_steps,
)


def attention_ops(fn: Callable[[], object]) -> list[str]:
    """Names of the profiled ops whose name contains ``attention`` while ``fn()`` runs.

    ``aten::scaled_dot_product_attention`` is the entry point; the op under it names the kernel,
    e.g. ``aten::_scaled_dot_product_flash_attention_for_cpu`` or ``..._attention_math``.
    """
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
    return sorted({e.key for e in prof.key_averages() if "attention" in e.key})


def fused_for_training(shape: tuple[int, int, int, int], dtype: torch.dtype,
                       device: torch.device | str) -> bool:
    """True if SDPA picks a fused kernel, not the math fallback, for a causal ``(batch, heads,
    seq, head_dim)`` attention whose inputs need gradients, as in training.

    MPS has no fused kernel; ROCm's come from AOTriton only on some architectures. The math
    fallback computes 16-bit attention in float32 and saves the score matrix, so what AMP saves
    depends on the answer.
    """
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    ran = attention_ops(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True).sum().backward())
    return not any("attention_math" in op for op in ran)


def backend_runs(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 is_causal: bool = True) -> bool:
    """True if SDPA runs with only ``backend`` allowed; False if it raises "no viable backend".
    """
    try:
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    except RuntimeError:
        return False
    return True


def attention_cost(backend: SDPBackend | None, shape: tuple[int, int, int, int],
                   dtype: torch.dtype, device: torch.device | str, steps: int) -> dict[str, float]:
    """Time and memory of one causal SDPA forward + backward on random ``(batch, heads, seq,
    head_dim)`` inputs; ``backend=None`` lets SDPA choose, otherwise only ``backend`` may run.

    Returns the median and IQR time (ms) of ``steps`` timed steps after one warm-up (device
    synchronised), the bytes autograd saves for backward (MB) and the allocator peak (MB; NaN
    where the device has no allocator statistics).
    """
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def attend() -> torch.Tensor:
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def step(_: int) -> None:
        attend().sum().backward()
        q.grad = k.grad = v.grad = None

    reset_peak_memory(device)
    timing, _ = time_steps(step, steps, device, 1, progress=False)
    peak = peak_memory_bytes(device)
    return {"time fwd+bwd median (ms)": timing.median * 1e3, "IQR (ms)": timing.iqr * 1e3,
            "saved for backward (MB)": saved_bytes(attend).new / 2**20,
            "peak (MB)": peak / 2**20 if peak is not None else float("nan")}
