"""Which ATen ops a piece of code really ran, counted by PyTorch's profiler.

A dtype on a tensor says what was stored, not which kernel computed it: the profiler's table of
ATen ops (``torch.profiler``, ``key_averages()``) is the record of what ran, e.g. whether an FP8
linear called ``aten::_scaled_mm`` or fell back to ``aten::mm``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def op_counts(fn: Callable[[], object], device: torch.device | str = "cpu") -> dict[str, int]:
    """Run ``fn()`` once under the profiler and return how often each op ran, by name.

    Ops are recorded on the CPU side, where every ATen call is dispatched, so the names are the
    same on every device; CUDA kernels are also listed on a CUDA or ROCm device.
    """
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
    return {event.key: event.count for event in prof.key_averages()}
