"""Which scaled-dot-product-attention kernel ran, read off the running device (lesson 11).

``F.scaled_dot_product_attention`` picks a backend at run time (flash, memory-efficient, cuDNN,
math) from the device, the dtype and the inputs. The profiler names the kernel that ran;
``torch.nn.attention.sdpa_kernel`` restricts the choice, and raises when none of the allowed
backends can run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile


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


def backend_runs(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 is_causal: bool = True) -> bool:
    """True if SDPA runs with only ``backend`` allowed; False if it raises "no viable backend"."""
    try:
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    except RuntimeError:
        return False
    return True
