"""What ``course_tools.memory`` and the handout run inside a lesson's kernel: the peak of live
tensor memory on the CPU (``LiveTensorMemory``), the preset with its step counts cut
(``cap_steps``), and a GPU's allocator peak over a whole lesson (``AllocatorPeak``).

This module imports only torch and the presets, so a kernel loads it in a moment; the command that
runs the lessons is ``course_tools.memory``.

**How the CPU peak is counted.** PyTorch's CPU allocator reports every allocation and every free
to the profiler while a profiler runs with ``profile_memory`` (``ProfiledCPUMemoryReporter`` in
``c10/core/CPUAllocator.cpp``); the profiler returns them as ``[memory]`` events with the signed
size. The live bytes at any moment are the running sum of those sizes in time order, and the peak
is its maximum. The reporter only reports the free of a block it saw allocated while a profiler
recorded memory ("Memory block of unknown size was allocated before the profiling started" is
its warning), and the tracker counts a free only where it saw the block's allocation (the events
carry the address), so tensors made before tracking started never count, their frees included,
even where the reporter remembers an older block at the same address. This
is every CPU tensor's storage: parameters, gradients, optimizer state, activations, the
temporaries inside kernels that come from the allocator, and the buffers of ``torch.compile``d
code: Inductor's generated CPU code allocates them with ``empty_strided_cpu``, which a
``TorchDispatchMode`` would not see (it bypasses the dispatcher), and under an active dispatch
mode TorchDynamo does not compile at all (``convert_frame.py`` skips the frame, and already
compiled code runs eagerly), so a dispatch mode would have measured lesson 14 in eager mode. Both
were checked with torch 2.14: a compiled ``relu(x @ w)`` showed its 4 MiB ``mm`` buffer in the
profiler's events, and under a dispatch mode the same call ran as eager ATen ops.

The profiler runs with a scope filter that matches no op of the course (``LITE_INTERPRETER``), so
it records the memory events and no op events: the event buffer grows with allocations only.

**Lessons that profile.** Only one profiler session runs per thread: a second one cancels the
first (Kineto: "Cancelling current trace request"). Lessons 13 and 17 profile ops, so while
tracking, ``torch.autograd.profiler.profile`` (which ``torch.profiler.profile`` uses) is wrapped:
when a lesson's profiler prepares, the tracker stops and folds in its events; the lesson's
profiler records memory too (``profile_memory=True``); when it stops, its memory events are
folded in, taken out of what the lesson reads (``prof.events()`` would otherwise list them as
events whose ``input_dtypes`` is None, which lesson 17's dtype table cannot read), and the
tracker starts again.
Nothing allocated between the two is missed.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch._C._autograd import (
    _disable_profiler,
    _enable_profiler,
    _prepare_profiler,
)
from torch._C._profiler import (
    ProfilerActivity,
    ProfilerConfig,
    ProfilerState,
    RecordScope,
    _ExperimentalConfig,
    _ExtraFields_Allocation,
)

from amp_tutorial import presets

MEMORY_EVENT = "[memory]"
NO_OP_SCOPE = {RecordScope.LITE_INTERPRETER}  # the lessons run no TorchScript mobile code
RESULT_MARK = "course_tools.live_memory:"  # the line the epilogue prints, JSON after the mark


def cap_steps(name: str, steps: int, warmup: int, inference_steps: int,
              transformer_steps: int, transformer_warmup: int) -> presets.Preset:
    """Replace the preset ``name`` in this process with its step counts cut (sizes unchanged).

    ``get_preset`` looks the name up in ``presets.PRESETS`` at every call, so the lessons that
    run after this get the cut preset, under its own name. Counts already below a cap stay.
    """
    full = presets.PRESETS[name]
    transformer = dataclasses.replace(full.transformer,
                                      steps=min(full.transformer.steps, transformer_steps),
                                      warmup=min(full.transformer.warmup, transformer_warmup))
    cut = dataclasses.replace(full, steps=min(full.steps, steps), warmup=min(full.warmup, warmup),
                              inference_steps=min(full.inference_steps, inference_steps),
                              transformer=transformer)
    presets.PRESETS[name] = cut
    return cut


def _memory_config() -> ProfilerConfig:
    # state, record shapes, profile memory, with stack, with flops, with modules, experimental
    return ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False,
                          _ExperimentalConfig())


# The device types whose memory events are CPU memory (as torch.autograd.profiler counts them).
CPU_MEMORY = ("cpu", "mkldnn", "ideep")


def memory_events(results: Any) -> list[tuple[int, int, int]]:
    """``(time in ns, signed bytes, address)`` of the CPU allocations and frees in a profiler's
    results, in time order (the events of several threads are merged by time; an allocation made
    inside an op is a child of that op's node in the event tree)."""
    found = []
    nodes = list(results.experimental_event_tree())
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        fields = node.extra_fields
        if isinstance(fields, _ExtraFields_Allocation) and fields.device.type in CPU_MEMORY:
            found.append((node.start_time_ns, fields.alloc_size, fields.ptr))
    return sorted(found)


class _WithoutMemoryEvents:
    """A lesson profiler's results less the ``[memory]`` events the tracker made it record, so
    that the lesson's ``prof.events()`` are what it asked for (``torch.autograd.profiler`` turns
    memory events it cannot attach to an op into events of their own, ``input_dtypes`` None)."""

    def __init__(self, results: Any) -> None:
        self._results = results

    def events(self) -> list[Any]:
        return [event for event in self._results.events() if event.name() != MEMORY_EVENT]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._results, name)


class LiveTensorMemory:
    """The peak of live CPU tensor bytes between ``start()`` and ``stop()``, from the profiler.

    ``peak`` and ``live`` count only storage allocated after ``start()``; ``live`` is what is
    still allocated at the last fold (at ``stop()``: what the lesson left alive).

    Meant for a fresh process (a lesson's kernel, one torchrun process), started before the code
    it measures: the allocator's reporter keeps the size of each block allocated while memory was
    profiled until it sees that block freed under profiling, so a block still alive at ``stop()``
    and freed afterwards stays in its table, and a later session that frees a new block at the
    same address would be told the old size.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.allocations = 0
        self.profiled_by_lesson = 0  # sessions of the lesson's own profilers, folded in
        self._recording = False
        self._tracking = False
        self._paused_for: object | None = None
        self._originals: dict[str, Any] = {}
        self._blocks: dict[int, int] = {}  # address -> bytes of each block seen allocated, alive

    def fold(self, events: Iterable[tuple[int, int, int]]) -> None:
        """Add memory events ``(time, signed bytes, address)``, in time order, to the running
        total. A free counts only where this tracker saw its block allocated: the reporter also
        reports the free of a block it remembers from an earlier profiling session in the same
        process (alive when that one stopped), with that block's size, at whatever new block
        reuses the address, which would take ``live`` below zero."""
        for _, nbytes, address in events:
            if nbytes < 0 and self._blocks.pop(address, None) is None:
                continue
            if nbytes > 0:
                self._blocks[address] = nbytes
                self.allocations += 1
            self.live += nbytes
            self.peak = max(self.peak, self.live)

    def start(self) -> LiveTensorMemory:
        if self._tracking:
            raise RuntimeError("this tracker is already running")
        self._wrap_lesson_profilers()
        self._tracking = True
        self._record()
        return self

    def stop(self) -> LiveTensorMemory:
        if self._recording:
            self._fold_own()
        self._unwrap_lesson_profilers()
        self._tracking = False
        return self

    def _record(self) -> None:
        config = _memory_config()
        _prepare_profiler(config, {ProfilerActivity.CPU})
        _enable_profiler(config, {ProfilerActivity.CPU}, NO_OP_SCOPE)
        self._recording = True

    def _fold_own(self) -> None:
        results = _disable_profiler()
        self._recording = False
        self.fold(memory_events(results))

    def _wrap_lesson_profilers(self) -> None:
        profile = torch.autograd.profiler.profile
        prepare, leave = profile._prepare_trace, profile.__exit__
        self._originals = {"_prepare_trace": prepare, "__exit__": leave}
        tracker = self

        def _prepare_trace(prof: Any) -> Any:
            if tracker._recording:
                tracker._fold_own()
            tracker._paused_for = prof
            prof._asked_for_memory = prof.profile_memory
            prof.profile_memory = True  # so nothing allocated while it runs is missed
            return prepare(prof)

        def __exit__(prof: Any, *exc_info: Any) -> Any:
            result = leave(prof, *exc_info)
            if tracker._paused_for is prof:
                tracker._paused_for = None
                tracker.profiled_by_lesson += 1
                results = getattr(prof, "kineto_results", None)
                if results is not None:
                    tracker.fold(memory_events(results))
                    if not prof._asked_for_memory:  # give the lesson the events it asked for
                        prof.profile_memory = False
                        prof.kineto_results = _WithoutMemoryEvents(results)
                if tracker._tracking:
                    tracker._record()
            return result

        profile._prepare_trace = _prepare_trace
        profile.__exit__ = __exit__

    def _unwrap_lesson_profilers(self) -> None:
        profile = torch.autograd.profiler.profile
        for name, original in self._originals.items():
            setattr(profile, name, original)
        self._originals = {}

    def result(self) -> dict[str, int]:
        return {"peak_bytes": self.peak, "live_bytes": self.live, "allocations": self.allocations,
                "profiled_by_lesson": self.profiled_by_lesson, "max_rss_bytes": max_rss_bytes()}


def max_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def print_result(result: dict[str, Any]) -> None:
    """The one line a runner reads back from the kernel's output."""
    print(RESULT_MARK + json.dumps(result), flush=True)


def read_result(text: str) -> dict[str, Any] | None:
    """The result a kernel printed with ``print_result``, or None."""
    for line in text.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return None


class AllocatorPeak:
    """``max_memory_allocated`` of a GPU over a whole lesson, also across the lesson's resets.

    Lessons reset the allocator's peak before each run they measure (``measure.reset_peak_memory``
    calls ``torch.cuda.reset_peak_memory_stats``), so reading the peak at the end alone would give
    the last run's. While installed, each reset first adds the peak so far to ``peak``.
    ``modules``: the device modules to watch, by device type (default ``torch.cuda`` and
    ``torch.xpu``).
    Not run on a GPU yet (none was available): ``docs/gpu-register.md``.
    """

    def __init__(self, modules: dict[str, Any] | None = None) -> None:
        self.modules = modules if modules is not None else {
            name: getattr(torch, name) for name in ("cuda", "xpu") if hasattr(torch, name)}
        self.peak: dict[str, int] = {}  # "cuda:0" -> bytes
        self._originals: list[tuple[Any, Any]] = []

    def _fold(self, name: str, device: Any = None) -> None:
        module = self.modules[name]
        if not module.is_initialized():  # nothing allocated there; do not create a context
            return
        index = device if isinstance(device, int) else (
            None if device is None else torch.device(device).index)
        index = module.current_device() if index is None else index
        # 0 is a reading too: a process that started the runtime (lesson 11's, which asks for
        # the device's name, H200 2026-11-27) and allocated nothing there
        peak = int(module.max_memory_allocated(index))
        self.peak[f"{name}:{index}"] = max(self.peak.get(f"{name}:{index}", 0), peak)

    def install(self) -> AllocatorPeak:
        """Wrap each module's ``reset_peak_memory_stats`` (also as ``module.memory``'s)."""
        for name, module in self.modules.items():
            owners = [module, *([module.memory] if hasattr(module, "memory") else [])]
            for owner in owners:
                original = owner.reset_peak_memory_stats

                def reset(device: Any = None, _name: str = name, _original: Any = original) -> Any:
                    self._fold(_name, device)
                    return _original(device)

                self._originals.append((owner, original))
                owner.reset_peak_memory_stats = reset
        return self

    def uninstall(self) -> None:
        for owner, original in reversed(self._originals):
            owner.reset_peak_memory_stats = original
        self._originals = []

    def read(self) -> dict[str, int]:
        """The peak per device used (``{"cuda:0": bytes}``) over the whole lesson."""
        for name, module in self.modules.items():
            if module.is_initialized():
                for index in range(module.device_count()):
                    self._fold(name, index)
        return dict(self.peak)
