"""What the tools run inside a lesson's kernel (course_tools.live_memory): the peak of live CPU
tensor memory from the profiler's memory events, the preset with its steps cut, and a GPU
allocator's peak across a lesson's resets. Each test frees what it allocated before the tracker
stops: the CPU allocator's reporter remembers blocks that were alive when profiling stopped, so
they must not outlive the test in this shared process (a lesson's kernel is fresh)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest
import torch

from amp_tutorial import presets
from amp_tutorial.measure import op_dtype_rows
from course_tools.live_memory import (
    AllocatorPeak,
    LiveTensorMemory,
    cap_steps,
    print_result,
    read_result,
)

MIB = 2**20
ATTEMPTS = 20


def block(mib: int) -> torch.Tensor:
    return torch.empty(mib * MIB, dtype=torch.uint8)


def test_the_peak_is_the_most_bytes_alive_at_once() -> None:
    tracker = LiveTensorMemory().start()
    a, b = block(8), block(4)
    del a  # 12 MiB were alive together; now 4
    c = block(2)
    live_at_end = tracker.stop().live
    del b, c
    assert tracker.peak == 12 * MIB
    assert live_at_end == 6 * MIB
    assert tracker.allocations == 3


def test_freed_tensors_are_not_counted_twice() -> None:
    tracker = LiveTensorMemory().start()
    for _ in range(10):
        x = block(4)
        del x
    y = block(1)
    del y
    tracker.stop()
    assert tracker.peak == 4 * MIB  # one block at a time, not 41 MiB
    assert tracker.live == 0 and tracker.allocations == 11


def test_tensors_made_before_tracking_are_ignored() -> None:
    before = block(32)
    tracker = LiveTensorMemory().start()
    del before  # its free is not reported: the reporter never saw it allocated
    after = block(1)
    del after
    tracker.stop()
    assert tracker.peak == 1 * MIB
    assert tracker.live == 0  # not -32 MiB


def test_a_free_the_reporter_remembers_from_an_earlier_session_is_not_counted() -> None:
    """The reporter remembers a block that was alive when a profiling session stopped, and reports
    its free, with that size, to a later session (CI saw a peak of 0 here once: a worker's earlier
    tests had left such a block, and a new one at its address was freed under tracking). The block
    itself, freed under tracking, gives the same event without waiting for glibc to reuse an
    address (in a worker's used heap it often does not)."""
    earlier = LiveTensorMemory().start()
    stale = block(32)
    address = stale.data_ptr()
    earlier.stop()  # the block is still alive: the reporter keeps its size
    tracker = LiveTensorMemory()
    folded: list[tuple[int, int, int]] = []
    fold = tracker.fold

    def fold_and_keep(events: Iterable[tuple[int, int, int]]) -> None:
        events = list(events)
        folded.extend(events)
        fold(events)

    tracker.fold = fold_and_keep  # type: ignore[method-assign]
    tracker.start()
    del stale  # reported as a free of 32 MiB, a block this tracker never saw allocated
    after = block(1)
    del after
    tracker.stop()
    assert (-32 * MIB, address) in [(nbytes, ptr) for _, nbytes, ptr in folded]
    assert (tracker.peak, tracker.live, tracker.allocations) == (1 * MIB, 0, 1)


def test_frees_are_paired_with_allocations_by_address() -> None:
    tracker = LiveTensorMemory()
    tracker.fold([(1, -32 * MIB, 0xA000), (2, 1 * MIB, 0xB000), (3, 2 * MIB, 0xC000),
                  (4, -1 * MIB, 0xB000), (5, -1 * MIB, 0xB000)])  # a free seen twice counts once
    assert (tracker.peak, tracker.live, tracker.allocations) == (3 * MIB, 2 * MIB, 2)


def test_a_lessons_own_profiler_does_not_hide_its_allocations() -> None:
    """A second profiler session cancels the first; the tracker steps aside, reads the lesson's
    profiler's memory events, and goes on after it, while the lesson still gets its op events."""
    profile = torch.autograd.profiler.profile
    originals = (profile._prepare_trace, profile.__exit__)
    tracker = LiveTensorMemory().start()
    kept = block(2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        inside = block(16)
        squared = inside * inside
        del inside, squared
    after = block(4)  # counted: the tracker records again
    del kept, after
    tracker.stop()
    assert tracker.peak == 34 * MIB  # 2 + 16 + 16
    assert tracker.profiled_by_lesson == 1 and tracker.live == 0
    assert "aten::empty" in {event.key for event in prof.key_averages()}
    # no [memory] events (their input_dtypes are None): lesson 17's op_dtype_rows reads them all
    assert "[memory]" not in {event.name for event in prof.events()}
    assert [row["op"] for row in op_dtype_rows(prof.events())] == ["aten::mul"]
    assert (profile._prepare_trace, profile.__exit__) == originals  # unwrapped at stop


def test_steps_are_cut_and_sizes_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(presets.PRESETS, "paper", presets.PRESETS["paper"])  # restored after
    full = presets.PRESETS["paper"]
    cut = cap_steps("paper", steps=3, warmup=1, inference_steps=2, transformer_steps=2,
                    transformer_warmup=1)
    assert presets.get_preset("paper") is cut
    assert (cut.steps, cut.warmup, cut.inference_steps) == (3, 1, 2) != (
        full.steps, full.warmup, full.inference_steps)
    assert (cut.transformer.steps, cut.transformer.warmup) == (2, 1)
    assert dataclasses.replace(cut, steps=full.steps, warmup=full.warmup,
                               inference_steps=full.inference_steps,
                               transformer=full.transformer) == full  # nothing else changed


def test_the_result_line_reads_back() -> None:
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print("a lesson's own output")
        print_result({"peak_bytes": 5})
    assert read_result(printed.getvalue()) == {"peak_bytes": 5}
    assert read_result("nothing here") is None


class StandInAllocator:
    """The part of ``torch.cuda`` AllocatorPeak uses, with the caching allocator's semantics: the
    peak of allocated bytes since the last reset (no GPU here)."""

    def __init__(self) -> None:
        self.allocated, self.max = 0, 0

    def allocate(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.max = max(self.max, self.allocated)

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def max_memory_allocated(self, device: int | None = None) -> int:
        return self.max

    def reset_peak_memory_stats(self, device: object = None) -> None:
        self.max = self.allocated


def test_the_allocator_peak_spans_the_lessons_resets() -> None:
    gpu = StandInAllocator()
    peak = AllocatorPeak({"cuda": gpu}).install()
    gpu.allocate(100)  # the first run's peak
    gpu.allocated -= 100
    gpu.reset_peak_memory_stats("cuda")  # the lesson starts its next run
    gpu.allocate(30)
    assert gpu.max_memory_allocated() == 30  # what reading only at the end would give
    assert peak.read() == {"cuda:0": 100}
    peak.uninstall()
    assert gpu.reset_peak_memory_stats.__func__ is StandInAllocator.reset_peak_memory_stats


def test_a_runtime_started_without_an_allocation_reads_as_a_zero_peak() -> None:
    # lesson 11 on an H200: CUDA started (the device's name was read), nothing allocated there;
    # an empty reading made gpu_check call the lesson's peak missing
    assert AllocatorPeak({"cuda": StandInAllocator()}).install().read() == {"cuda:0": 0}
