"""Comparing ways to run a step on a busy machine: interleaved, against a control.

Runs timed one after the other see different loads: a class hub's other learners start and
stop jobs, so a ratio of two separate runs' medians measures the load as much as AMP. Here the
runs take turns, step by step, in palindromic blocks, and the answer comes with an interval and
a control:

- **order**: one block runs every run once, then all again in reverse (``A B C C B A``), so
  each run's two steps sit at the same mean position and a load that rises or falls steadily
  through a block slows every run alike (the ABBA design; Kalibera and Jones, "Rigorous
  benchmarking in reasonable time", 2013). The runs take turns at the block's edges and its
  middle, where a run follows itself and finds its caches warm, from one block to the next.
- **ratio**: per block, the baseline's two steps over the run's two (a speed-up:
  ``t_baseline / t``, above 1 the run is faster); the median over blocks, with a 90% interval
  from a bootstrap over blocks (``BOOTSTRAPS`` resamples, fixed seed, percentiles 5 and 95).
- **control**: the baseline's twin (the same step built twice, e.g. a second identically seeded
  fp32 model) is compared with the baseline the same way, an A/A comparison whose true answer is
  1. A ratio is stated only when the control's interval reaches within ``CONTROL_SLACK`` of 1
  and both intervals are narrow (each no wider than ``WIDE`` of its median); otherwise it says
  why.
- **threads**: on a CPU whose warm-up steps waited for a core (over ``BUSY_WAIT`` of their time,
  per thread), every run is timed on one thread and read in process CPU time: a step whose
  threads wait for each other runs at its slowest thread's pace, and a busy machine slows
  fp32's many short parallel regions more than emulated bf16's long ones, so with all threads
  the ratio itself moves with the load. The answer is then per core, and says so.

``docs/benchmark.md`` ("Comparing on a busy machine") has the measurements behind ``WIDE`` and
``BUSY_WAIT``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from amp_tutorial.measure import UNTIMED_PRESETS, StepTimer, Timing, comparison_words

BOOTSTRAPS = 2000  # resamples of the blocks for each interval
# An interval wider than this share of its median says too little to state: measured on a 2-core
# Zen 3 (docs/benchmark.md), idle intervals were 8-20% of their median, with 4 CPU hogs 20-45%
WIDE = 0.5
# Warm-up steps whose threads each waited for a CPU over this share of the time: the machine is
# busy, so the comparison runs on one thread (idle, about 1% per thread)
BUSY_WAIT = 0.1
MIN_BLOCKS = 5  # fewer blocks give no interval worth the name
# blocks for a comparison with no step count of its own to go by (the check-up, the ladder): with
# MIN_BLOCKS, lesson 18's ConvModel on an idle 2-core Zen 3 gave an interval 88% of its median,
# and lesson 17's rungs beside 4 CPU hogs 50-53%
BLOCKS = 8
# The A/A control passes when its interval reaches within this of 1: the twins' steps differ in
# where they sit (a run's second step right after its first finds warm caches), which the
# rotation evens out only on average; a gap this small is not what a lesson's ratio is about
CONTROL_SLACK = 0.05


def block_order(names: Sequence[str], baseline: str, control: str, block: int = 0) -> list[str]:
    """Block number ``block``'s order: the runs (baseline first, its control last), rotated by
    the block number, then the same in reverse; every run twice, at the block's middle on
    average, and each run in the middle once every ``len(names)`` blocks."""
    runs = [baseline, *(n for n in names if n not in (baseline, control)), control]
    shift = block % len(runs)
    first = runs[shift:] + runs[:shift]
    return first + first[::-1]


def median_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """The median of ``values`` and its 90% bootstrap interval (percentiles 5 and 95 of the
    medians of ``BOOTSTRAPS`` resamples drawn with replacement, a fixed seed)."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, len(data), (BOOTSTRAPS, len(data)))], axis=1)
    low, high = np.percentile(medians, [5, 95])
    return float(np.median(data)), float(low), float(high)


@dataclass(frozen=True)
class Ratio:
    """A speed-up ``t_baseline / t`` from interleaved blocks: its median and 90% interval."""

    median: float
    low: float
    high: float
    blocks: int

    @property
    def width(self) -> float:
        """The interval's width as a share of the median."""
        return (self.high - self.low) / self.median if self.median > 0 else float("inf")

    def __str__(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


@dataclass(frozen=True)
class PairedComparison:
    """One run against the baseline, from interleaved steps: the ratio where it can be stated,
    else why not. Reads like ``measure.Comparison`` (``ratio``, ``stated``, ``noise``), so the
    lessons' tables and figures take either."""

    name: str
    baseline_name: str
    estimate: Ratio
    control: Ratio
    basis: str  # what was timed: "wall time" or "CPU time, one thread per run"
    preset: str
    noisy_runs: dict[str, str] = field(default_factory=dict)  # never per run here: see noise
    controlled: str = ""  # the run whose A/A control judged the machine (default: the baseline)

    @property
    def _control_name(self) -> str:
        return self.controlled or self.baseline_name

    @property
    def ratio(self) -> float:
        return self.estimate.median

    @property
    def noise(self) -> str | None:
        """Why the ratio is not a result here, or None when it is."""
        if self.preset in UNTIMED_PRESETS:
            return UNTIMED_PRESETS[self.preset]
        if self.estimate.blocks < MIN_BLOCKS:
            return f"{self.estimate.blocks} blocks are too few for an interval"
        if not self.control.low * (1 - CONTROL_SLACK) <= 1 <= self.control.high * (
                1 + CONTROL_SLACK):
            return (f"{self._control_name} against itself gave {self.control}, not 1: the "
                    "machine's load moved between steps")
        for what, r in (("the interval", self.estimate), ("the control's interval", self.control)):
            if r.width > WIDE:
                return (f"{what}, {r.low:.2f}-{r.high:.2f}x, is {r.width:.0%} of its median "
                        f"(more than {WIDE:.0%}): the machine was too busy to say")
        return None

    @property
    def stated(self) -> float | None:
        return None if self.noise else self.ratio

    def __str__(self) -> str:
        return comparison_words(
            self, str(self.estimate), f"90% interval, {self.estimate.blocks} interleaved blocks, "
            f"{self.basis}; {self._control_name} against itself: {self.control}",
            f"no ratio here ({self.noise}; measured {self.estimate})")


@dataclass(frozen=True)
class Interleaved:
    """What ``interleave`` measured: each run's step timings and the comparisons they give."""

    baseline: str
    control: str
    timings: dict[str, Timing]
    threads: int | None  # torch's CPU threads while timing (None on a GPU)
    one_thread: bool  # True where the machine was busy and each run got one thread
    preset: str

    @property
    def basis(self) -> str:
        return "CPU time, one thread per run" if self.one_thread else "wall time"

    def step_times(self, name: str) -> Timing:
        """``name``'s per-step times as the comparison read them: process CPU time where each
        run got one thread, else the wall times (with their waits)."""
        timing = self.timings[name]
        return Timing(timing.cpu) if self.one_thread and timing.cpu else timing

    def _block_sums(self, name: str) -> list[float]:
        times = self.step_times(name).samples
        return [times[i] + times[i + 1] for i in range(0, len(times) - 1, 2)]

    def ratio(self, name: str, against: str | None = None) -> Ratio:
        """``against``'s time over ``name``'s, block by block (default: the baseline's)."""
        base = self._block_sums(against or self.baseline)
        run = self._block_sums(name)
        median, low, high = median_interval([b / r for b, r in zip(base, run, strict=True)])
        return Ratio(median, low, high, len(run))

    def comparison(self, name: str, against: str | None = None) -> PairedComparison:
        """``name`` against the baseline, or against another run of the same blocks (e.g. a
        compiled step against its eager twin); the baseline's A/A control judges the machine
        either way."""
        return PairedComparison(name, against or self.baseline, self.ratio(name, against),
                                self.ratio(self.control), self.basis, self.preset,
                                controlled=self.baseline)

    def comparisons(self) -> list[PairedComparison]:
        """Every run but the baseline and its control, against the baseline."""
        return [self.comparison(n) for n in self.timings if n not in (self.baseline, self.control)]


def numbered(step: Callable[[int], object]) -> Callable[[], object]:
    """``step(i)`` as a call without arguments, ``i`` counting 0, 1, 2, ... from the first call:
    a course step that walks its batches, made into one of ``interleave``'s runs."""
    calls = itertools.count()
    return lambda: step(next(calls))


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def interleave(steps: Mapping[str, Callable[[], object]], baseline: str, control: str,
               device: torch.device | str, blocks: int, warmup: int = 1, preset: str = "",
               one_thread: bool | None = None, progress: bool = True) -> Interleaved:
    """Call each run's ``step()`` in turn, ``blocks`` palindromic blocks of two steps per run
    (``block_order``) after ``warmup`` untimed blocks, and time every step (``StepTimer``:
    device synchronised around it, CPU waits and process CPU time read).

    ``control`` names the baseline's twin (the same step, built again). ``one_thread``: None
    decides on a CPU from the warm-up (its threads waited for a core over ``BUSY_WAIT`` of the
    time: one thread); True or False forces it. Nothing changes on a GPU.
    """
    if baseline not in steps or control not in steps:
        raise ValueError(f"steps need the baseline {baseline!r} and its control {control!r}")
    if blocks < 1:
        raise ValueError(f"blocks must be at least 1, got {blocks}")
    names = list(steps)
    order = [n for b in range(blocks) for n in block_order(names, baseline, control, b)]
    on_cpu = torch.device(device).type == "cpu"
    probe = StepTimer(device)
    for name in block_order(names, baseline, control) * max(warmup, 1):  # kernels chosen,
        # caches filled, the machine's load read
        with probe.step():
            steps[name]()
    busy = on_cpu and (probe.timing.wait_share or 0.0) > BUSY_WAIT
    single = on_cpu and (busy if one_thread is None else one_thread)
    timers = {name: StepTimer(device) for name in steps}
    with _torch_threads(1 if single else None):
        threads = torch.get_num_threads() if on_cpu else None
        for name in tqdm(order, desc="interleaved steps", disable=not progress):
            with timers[name].step():
                steps[name]()
    return Interleaved(baseline, control, {n: t.timing for n, t in timers.items()}, threads,
                       single, preset)

