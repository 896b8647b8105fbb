"""Where a training step's time goes: matmuls, attention, memory-bound ops, the optimizer, idle.

One profile of a few steps (``torch.profiler``), each step inside a ``record_function`` range
that ends with the device synchronised, so its length is the step's wall time. Then:

- on a GPU, every **device kernel** is put in a group by its name, and *idle* is the part of the
  steps' wall time in which no kernel ran (launch gaps, Python, syncs): the union of the kernels'
  intervals subtracted from the steps' total;
- on a CPU, every **ATen op's self time** is put in a group by its name and by the range it ran
  in (an op inside ``scaled_dot_product_attention`` is attention, one inside the optimizer's step
  is the optimizer), and *idle* is the time in the step range that no op took (Python, dispatch).

The groups: ``matmul`` (matmuls and convolutions: GEMM kernels, ``aten::mm``/``addmm``/``bmm``),
``attention`` (SDPA's fused kernels, or its math path's ops on a CPU), ``optimizer`` (the
optimizer's and the GradScaler's foreach kernels and ops), and ``memory-bound`` for the rest:
norms, activations, residual adds, casts, copies, the loss, each limited by memory traffic rather
than arithmetic.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from amp_tutorial.measure import synchronize

GROUPS = ("matmul", "attention", "memory-bound", "optimizer", "idle")
STEP_RANGE = "amp_tutorial.step"

# device kernels, by name (checked in this order; case-insensitive)
_KERNEL_GROUPS = (
    ("optimizer", r"multi_tensor_apply|amp_update_scale|fused_adam|adamw?_|foreach"),
    ("attention", r"flash|fmha|attention|attn|sdpa"),
    ("matmul", r"gemm|xmma|nvjet|cutlass|wgmma|cublas|cudnn|triton_tem_|implicit"),
)
# CPU ops: a range that makes everything under it one group, then the op's own name
_CPU_RANGES = (
    ("optimizer", r"^Optimizer\.step|_amp_foreach_non_finite|_amp_update_scale"),
    ("attention", r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention"),
)
_CPU_MATMULS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|_scaled_mm|_addmm_activation|"
                          r"mkldnn_convolution|convolution_backward|_convolution|"
                          r"mkldnn_linear|mkldnn_matmul)$")


def kernel_group(name: str) -> str:
    """The group of a device kernel, from its name."""
    return next((group for group, pattern in _KERNEL_GROUPS
                 if re.search(pattern, name, re.IGNORECASE)), "memory-bound")


def cpu_op_group(name: str, ancestors: list[str]) -> str:
    """The group of a CPU op's self time, from its name and the names of the ranges above it."""
    for group, pattern in _CPU_RANGES:
        if any(re.search(pattern, n) for n in [name, *ancestors]):
            return group
    return "matmul" if _CPU_MATMULS.match(name) else "memory-bound"


@dataclass(frozen=True)
class TimeShares:
    """Seconds per step in each group (``GROUPS``) and the step's wall time."""

    seconds: dict[str, float]
    step_s: float
    source: str  # "device kernels" or "CPU ops"
    top: dict[str, float] = field(default_factory=dict)  # the longest kernels or ops, s per step

    @property
    def shares(self) -> dict[str, float]:
        """Each group's share of the step (they add up to 1, up to overlapping kernels)."""
        return {g: self.seconds[g] / self.step_s for g in GROUPS}

    def line(self) -> str:
        return ", ".join(f"{g} {s:.0%}" for g, s in self.shares.items())


def profile_steps(step: Callable[[int], object], device: torch.device | str, steps: int = 3,
                  warmup: int = 1) -> profile:
    """Run ``warmup`` untimed steps, then ``steps`` steps under the profiler, each step in a
    ``STEP_RANGE`` range that ends after the device is synchronised."""
    device = torch.device(device)
    for i in range(warmup):
        step(-1 - i)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(STEP_RANGE):
                step(i)
                synchronize(device)
    return prof


def time_shares(prof: profile) -> TimeShares:
    """Group the profiled steps' time (see the module's docstring); per step, in seconds."""
    events = prof.events()
    step_ranges = [e for e in events if e.name == STEP_RANGE and e.device_type == DeviceType.CPU]
    if not step_ranges:
        raise ValueError(f"no {STEP_RANGE!r} range in the profile: use profile_steps")
    steps = len(step_ranges)
    wall_us = sum(e.time_range.elapsed_us() for e in step_ranges)
    # a record_function range also shows on the GPU's timeline, as a user annotation that spans
    # its kernels: not a kernel, left out
    kernels = [e for e in events if e.device_type != DeviceType.CPU
               and not getattr(e, "is_user_annotation", False)]
    seconds = dict.fromkeys(GROUPS, 0.0)
    by_name: dict[str, float] = {}
    if kernels:
        source = "device kernels"
        for k in kernels:
            seconds[kernel_group(k.name)] += k.time_range.elapsed_us()
            by_name[k.name] = by_name.get(k.name, 0.0) + k.time_range.elapsed_us()
        busy = _union_us([(k.time_range.start, k.time_range.end) for k in kernels])
        seconds["idle"] = max(wall_us - busy, 0.0)
    else:
        source = "CPU ops"
        for e in events:
            if e.device_type != DeviceType.CPU or e.name == STEP_RANGE:
                continue
            ancestors = _ancestors(e)
            if STEP_RANGE not in ancestors:
                continue
            seconds[cpu_op_group(e.name, ancestors)] += e.self_cpu_time_total
            by_name[e.name] = by_name.get(e.name, 0.0) + e.self_cpu_time_total
        seconds["idle"] = sum(e.self_cpu_time_total for e in step_ranges)
    scale = 1e-6 / steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return TimeShares({g: s * scale for g, s in seconds.items()}, wall_us * scale, source,
                      {name: us * scale for name, us in top})


def _ancestors(event: object) -> list[str]:
    names = []
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total
