"""Which ATen ops a piece of code really ran, counted by PyTorch's profiler.

A dtype on a tensor says what was stored, not which kernel computed it: the profiler's table of
ATen ops (``torch.profiler``, ``key_averages()``) is the record of what ran, e.g. whether an FP8
linear called ``aten::_scaled_mm`` or fell back to ``aten::mm``. Which kernel an op reaches on a
device is in the dispatcher and in ``native_functions.yaml``: ``amp_tutorial.kernels``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def compiled_op_count(*ops: str) -> Iterator[Counter]:
    """Count ``ops`` (``"aten::_scaled_mm"``) in every graph Inductor compiles inside the block,
    forward and backward, as Inductor gets them (a post-grad pass), before it picks kernels.

    The profiler sees only the ops Inductor leaves to ATen: on a GPU it may compute a
    ``_scaled_mm`` with a Triton template of its own (``tuned_scaled_mm`` in
    ``torch/_inductor/kernel/mm.py`` offers them even without max-autotune), which no
    ``aten::_scaled_mm`` event records. A plain function as the pass also keeps Inductor from
    reusing a cached graph (its FX graph cache bypasses unknown passes), so the count is complete.
    """
    import torch._inductor.config as inductor_config

    wanted = {op.removeprefix("aten::").split(".")[0]: op for op in ops}
    counts: Counter = Counter(dict.fromkeys(ops, 0))

    def count(graph: torch.fx.Graph) -> None:
        for node in graph.nodes:
            packet = getattr(node.target, "_overloadpacket", None)
            if node.op == "call_function" and packet is not None and packet.__name__ in wanted:
                counts[wanted[packet.__name__]] += 1

    with inductor_config.patch(post_grad_custom_post_pass=count):
        yield counts


def events_with_dtypes(prof: profile) -> list:
    """``prof.events()`` of a run made with ``record_shapes=True``, each with ``input_dtypes``.

    ``FunctionEvent.input_dtypes`` exists in torch 2.14 but not in 2.9 or 2.11; the profiler's
    own record (``_KinetoEvent.dtypes()``, whose ``correlation_id()`` is the event's ``id``) has
    the dtypes in every supported torch, so events that lack them get them from there.
    """
    events = prof.events()
    missing = [e for e in events if getattr(e, "input_dtypes", None) is None]
    if missing:
        cpu = torch.autograd.DeviceType.CPU
        recorded = {k.correlation_id(): list(k.dtypes())
                    for k in prof.profiler.kineto_results.events() if k.device_type() == cpu}
        for event in missing:
            event.input_dtypes = recorded.get(event.id, []) if event.device_type == cpu else []
    return events


def cpu_has_amx_int8() -> bool:
    """Whether this CPU has AMX-INT8 (Intel Sapphire Rapids and newer), as cpuinfo reports it.

    torch 2.14 reads cpuinfo in ``torch._C._cpu._get_cpu_capability()``; older releases lack that
    call, and there the Linux kernel's CPU flags are read instead (False where neither exists).
    """
    capability = getattr(torch._C._cpu, "_get_cpu_capability", None)
    if capability is not None:
        return bool(capability().get("amx_int8", False))
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.is_file() and "amx_int8" in cpuinfo.read_text().split()


def cpu_scaled_mm_uses_onednn() -> bool:
    """Whether ``torch._scaled_mm`` on the CPU (FP8 inputs of one dtype) runs oneDNN's FP8 kernel.

    ATen's ``_scaled_mm_out_cpu`` (``aten/src/ATen/native/Blas.cpp``, torch 2.9 to 2.14) calls
    ``mkldnn_scaled_mm`` only when oneDNN is on (``torch.backends.mkldnn.enabled``) and the CPU
    has AMX-INT8 (``cpuinfo_has_x86_amx_int8``; e4m3 x e5m2 needs AMX-FP16 in 2.14). Elsewhere it
    dequantizes both inputs to fp32 (``aten::mul``) and multiplies with ``aten::matmul`` ->
    ``aten::mm``. ``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY`` do not change the choice,
    with one catch, seen with torch 2.14.1 on a Xeon with AMX: cpuinfo answers "no AMX" until it
    is initialised, which ATen's own CPU detection does unless ``ATEN_CPU_CAPABILITY`` is set. On
    torch 2.14 this function initialises it (``_get_cpu_capability``), so its answer holds for
    every FP8 matmul after it; call it before the first one. With oneDNN capped below AMX
    (``ONEDNN_MAX_CPU_ISA=AVX2``, the course's AVX2 emulation) the kernel it picks then cannot be
    built: ``_scaled_mm`` raises "could not create a primitive descriptor" (``fp8_matmul_problem``).
    """
    return (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            and cpu_has_amx_int8())


def fp8_matmul_problem() -> str | None:
    """Why an FP8 ``torch._scaled_mm`` (e4m3 x e4m3 -> bf16) fails on this CPU, in one line, or
    None where it runs. Asks ``cpu_scaled_mm_uses_onednn`` first, so the probe takes the kernel
    every later FP8 matmul of this process takes."""
    from amp_tutorial.device import ONEDNN_ISA_CAPS

    onednn = cpu_scaled_mm_uses_onednn()
    a, one = torch.ones(16, 16).to(torch.float8_e4m3fn), torch.ones(())
    try:
        torch._scaled_mm(a, a.t(), one, one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as error:
        first = str(error).splitlines()[0][:120]
        caps = [f"{n}={os.environ[n]}" for n in ONEDNN_ISA_CAPS if os.environ.get(n)]
        if onednn and caps:
            return (f"torch picks oneDNN's AMX FP8 kernel from the CPU's flags, but oneDNN is "
                    f"capped by {', '.join(caps)} and cannot build it ({first}); unset the cap")
        return f"torch {torch.__version__} has no CPU _scaled_mm ({first}); torch 2.9 and newer"
    return None


def self_times_per_step(prof: profile, steps: int
                        ) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
    """From a profile of ``steps`` steps: (calls, self ms) per step of each CPU op, and of each
    device kernel (CUDA, which ROCm shares, or XPU; none when only the CPU was profiled)."""
    from torch.autograd import DeviceType

    events = prof.key_averages()
    ops = {e.key: (e.count / steps, e.self_cpu_time_total / 1e3 / steps)
           for e in events if e.device_type == DeviceType.CPU}
    kernels = {e.key: (e.count / steps, e.self_device_time_total / 1e3 / steps)
               for e in events if e.device_type != DeviceType.CPU}
    return ops, kernels
