"""Measuring time and memory correctly on any device.

- the device is synchronised before every clock read (GPU work is asynchronous);
- warm-up steps run untimed (cuDNN/MIOpen pick kernels on first use);
- every step is timed, and the median and spread are reported, not one total;
- peak memory is reset before each run and read from the caching allocator where there is one;
- saved-activation bytes (the memory AMP halves) are counted exactly with saved_tensors_hooks,
  which works on every device, CPU included;
- compile times are taken with Inductor's on-disk cache in a fresh folder, never from a cache hit.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # where Inductor keeps compiled code between runs
# A timing whose interquartile range is more than this share of its median is noise, not a result
# (a class's shared machine, another job beside it): no ratio is stated from it
NOISY_SPREAD = 0.25
# A run whose threads waited for a CPU (runnable, not running) for more than this share of its
# wall time was slowed by other programs, however quiet its spread: no ratio is stated from it
CROWDED_SHARE = 0.25
# Presets whose steps are too small to time: overheads, not the arithmetic AMP changes, fill them
UNTIMED_PRESETS = {"smoke": "the smoke preset is too small to time (overheads fill each step)"}


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on ``device`` has finished (a no-op on CPU).
    """
    device_type = torch.device(device).type
    if device_type == "cuda":
        torch.cuda.synchronize(device)
    elif device_type == "mps":
        torch.mps.synchronize()
    elif device_type == "xpu":
        torch.xpu.synchronize(device)


def free_memory(device: torch.device | str) -> None:
    """Drop unreferenced tensors and return cached blocks, so one run cannot count in the next.
    """
    gc.collect()
    device_type = torch.device(device).type
    if device_type == "cuda":
        torch.cuda.empty_cache()
    elif device_type == "mps":
        torch.mps.empty_cache()
    elif device_type == "xpu":
        torch.xpu.empty_cache()


def reset_peak_memory(device: torch.device | str) -> None:
    """Free what can be freed, then start a new peak-memory window (no-op without allocator).
    """
    free_memory(device)
    device_type = torch.device(device).type
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device_type == "xpu":
        torch.xpu.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device | str) -> int | None:
    """Peak bytes held by tensors since the last reset; None where there are no allocator stats.
    """
    device_type = torch.device(device).type
    if device_type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device_type == "xpu":
        return torch.xpu.max_memory_allocated(device)
    return None


def cpu_wait_s() -> float | None:
    """Seconds this process's threads have waited for a CPU so far: runnable, but another
    program (or another of its own threads) held the core. Summed over the live threads from
    Linux's ``/proc/self/task/*/schedstat`` (its second field, the run-queue delay in ns); None
    where the kernel does not keep it (macOS, Windows, a kernel without schedstats).

    A busy machine slows a run in a way its spread can miss: a job beside it for the whole run
    makes every step slower by about as much, so the steps agree and the median is wrong. The
    wait shows it (a step that waited 40 ms for a CPU out of 100 ms lost them to someone else).
    """
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def crowded(wait_share: float | None) -> str | None:
    """Why a run whose threads waited for a CPU ``wait_share`` of its time is no result (over
    ``CROWDED_SHARE``: other programs held the cores, or the process ran more threads than the
    CPUs it may use), or None."""
    if wait_share is None or wait_share <= CROWDED_SHARE:
        return None
    return f"threads waited for a CPU for {wait_share:.0%} of its time"


def why_noisy(spread: float, wait_share: float | None) -> str | None:
    """Why a timing's median says little (its IQR over its median, ``spread``, above
    ``NOISY_SPREAD``, or threads that waited for a CPU over ``CROWDED_SHARE`` of the time), or
    None. ``Timing.why_noisy``; the check-up reads it from the figures it keeps."""
    if spread > NOISY_SPREAD:
        return f"spread is {spread:.0%} of its median"
    return crowded(wait_share)


def busy(noisy: dict[str, str]) -> str:
    """The one sentence for runs that are noise: ``{run name: why_noisy}``."""
    said = " and ".join(f"{name}'s {why}" for name, why in noisy.items())
    return f"{said}, more than {NOISY_SPREAD:.0%}: the machine was busy"


@dataclass(frozen=True)
class Timing:
    """Per-step wall times in seconds, with the statistics the course reports.

    ``waits``: per step, the seconds the process's threads waited for a CPU (``cpu_wait_s``);
    empty where that is not measured.
    """

    samples: tuple[float, ...]
    waits: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        return _quantile(self.samples, 0.25)

    @property
    def q3(self) -> float:
        return _quantile(self.samples, 0.75)

    @property
    def iqr(self) -> float:
        """Interquartile range: the spread of the middle half of the samples."""
        return self.q3 - self.q1

    @property
    def total(self) -> float:
        return sum(self.samples)

    @property
    def spread(self) -> float:
        """The interquartile range as a share of the median."""
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def wait_share(self) -> float | None:
        """The CPU waits over the wall time of the timed steps (summed over threads, so two
        threads that both waited all the time give 2.0); None where waits were not measured."""
        if not self.waits or self.total <= 0:
            return None
        return sum(self.waits) / self.total

    @property
    def why_noisy(self) -> str | None:
        """Why the median says little here (``why_noisy``), or None."""
        return why_noisy(self.spread, self.wait_share)

    @property
    def noisy(self) -> bool:
        """True when the median says little: a wide spread, or a run crowded off its CPUs."""
        return self.why_noisy is not None

    def __str__(self) -> str:
        n = len(self.samples)
        return f"{self.median * 1e3:.2f} ms/step (IQR {self.iqr * 1e3:.2f} ms, n={n})"



@dataclass(frozen=True)
class Comparison:
    """One run's time against the baseline's, and whether the ratio can be stated as a result.

    The one rule every timing sentence, table and bar of the course follows: a ratio is stated
    only when both timings are quiet (spread at most ``NOISY_SPREAD`` of the median) and the
    preset is big enough to time; otherwise the comparison says why it cannot be made here.

    Runs timed one after the other can each be quiet and still not comparable: a load that starts
    or stops between them (another learner's job) moves one run and not the other. Where the
    baseline was timed once more after the other runs (``baseline_again``), medians that differ
    by more than ``NOISY_SPREAD`` say so, and no ratio is stated.
    """

    name: str
    baseline_name: str
    timing: Timing
    baseline: Timing
    preset: str
    baseline_again: Timing | None = None  # the baseline timed again, after the other runs

    @property
    def ratio(self) -> float:
        """Speedup, ``t_baseline / t`` (medians): above 1, this run took less time per step."""
        return self.baseline.median / self.timing.median

    @property
    def noisy_runs(self) -> dict[str, str]:
        """Each of the two runs whose timing is noise, with why (``Timing.why_noisy``)."""
        return {name: t.why_noisy for name, t in ((self.baseline_name, self.baseline),
                                                  (self.name, self.timing)) if t.why_noisy}

    @property
    def noise(self) -> str | None:
        """Why the ratio is not a result here, or None when it is."""
        if self.preset in UNTIMED_PRESETS:
            return UNTIMED_PRESETS[self.preset]
        noisy = self.noisy_runs
        if noisy:
            return busy(noisy)
        again = self.baseline_again
        if again is not None and abs(again.median / self.baseline.median - 1) > NOISY_SPREAD:
            return (f"{self.baseline_name} took {self.baseline.median * 1e3:.3g} ms per step "
                    f"first and {again.median * 1e3:.3g} ms when timed again after the other "
                    "runs: the machine's load changed while they ran")
        return None

    @staticmethod
    def why_no_ratio(comparisons: Iterable[Comparison]) -> str | None:
        """Why some of these comparisons (one figure's bars, one table) give no ratio, each
        run's reason said once (a noisy fp32 baseline is one reason, not one per run against
        it); None where every one states its ratio."""
        comparisons = [c for c in comparisons if c.noise]
        if not comparisons:
            return None
        noisy = {name: why for c in comparisons for name, why in c.noisy_runs.items()}
        others = [c.noise for c in comparisons if not c.noisy_runs]  # a small preset, a moved load
        return "; ".join(dict.fromkeys(([busy(noisy)] if noisy else []) + others))

    @property
    def stated(self) -> float | None:
        """The ratio where it can be stated, else None."""
        return None if self.noise else self.ratio

    def __str__(self) -> str:
        if self.preset in UNTIMED_PRESETS:
            return (f"{self.name} against {self.baseline_name}: not compared here "
                    f"({self.noise}); run at a larger preset")
        if self.noise:
            return (f"{self.name} against {self.baseline_name}: too noisy to compare here "
                    f"({self.noise}); rerun on an idle machine")
        change = (f"{1 - 1 / self.ratio:.0%} less time per step" if self.ratio > 1
                  else f"{1 / self.ratio - 1:.0%} more time per step")
        return (f"{self.name} ran at {self.ratio:.2f}x the speed of {self.baseline_name} "
                f"({change}; t_{self.baseline_name} / t, medians)")


def timing_columns(timing: Timing, baseline: Timing, peak_bytes: int | None,
                   preset: str = "") -> dict[str, float]:
    """The columns every fp32-against-AMP results table starts with: median and IQR per step in
    ms, the speedup over the baseline (t_fp32 / t, medians; NaN where ``Comparison`` says the
    timings cannot be compared: a spread over ``NOISY_SPREAD`` or an untimed preset) and the
    allocator's peak in MB (NaN where there is no allocator peak, as on a CPU).
    """
    stated = Comparison("run", "baseline", timing, baseline, preset).stated
    return {
        "time/step median (ms)": timing.median * 1e3,
        "time/step IQR (ms)": timing.iqr * 1e3,
        "speedup (t_fp32 / t)": float("nan") if stated is None else stated,
        "peak memory (MB)": peak_bytes / 2**20 if peak_bytes is not None else float("nan"),
    }

def _quantile(values: tuple[float, ...], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class StepTimer:
    """Times the steps of a loop you write yourself: ``with timer.step():`` around each step.

    The first ``warmup`` steps are left out of the statistics (cuDNN/MIOpen pick kernels on first
    use, ``torch.compile`` compiles) and kept apart in ``warmup_samples``; every later step adds
    one sample. The device is synchronised before the clock starts (work queued before
    the step is not counted) and before it stops (the step's own GPU work is). A step that raises
    records nothing. ``timer.timing`` gives the median and interquartile range::

        timer = StepTimer(device, warmup=3)
        for batch in batches:
            with timer.step():
                ...  # zero_grad, autocast forward + loss, scaler.scale(loss).backward(), ...
        print(timer.timing)
    """

    def __init__(self, device: torch.device | str, warmup: int = 0) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {warmup}")
        self.device = torch.device(device)
        self.warmup = warmup
        self.samples: list[float] = []  # seconds, one per timed step
        self.warmup_samples: list[float] = []  # seconds, one per warm-up step
        self.waits: list[float] = []  # seconds waited for a CPU, one per timed step

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time the block as one step (kept apart in ``warmup_samples`` while warming up)."""
        synchronize(self.device)
        waited = cpu_wait_s()
        start = time.perf_counter()
        yield
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        if self.steps_seen < self.warmup:
            self.warmup_samples.append(elapsed)
            return
        self.samples.append(elapsed)
        now = cpu_wait_s()
        if waited is not None and now is not None:
            self.waits.append(max(0.0, now - waited))  # a thread that ended takes its wait along

    @property
    def steps_seen(self) -> int:
        """Steps that finished, warm-up included."""
        return len(self.warmup_samples) + len(self.samples)

    @property
    def timing(self) -> Timing:
        """The timed steps' statistics; an error before the first step after warm-up."""
        if not self.samples:
            raise ValueError(f"no timed step yet: {self.steps_seen} step(s) seen, "
                             f"the first {self.warmup} are warm-up")
        waits = tuple(self.waits) if len(self.waits) == len(self.samples) else ()
        return Timing(tuple(self.samples), waits)


def time_steps(
    step: Callable[[int], object],
    n_steps: int,
    device: torch.device | str,
    warmup: int = 0,
    desc: str | None = None,
    progress: bool = True,
    keep_all: bool = True,
    budget_s: float | None = None,
) -> tuple[Timing, list[object]]:
    """A :class:`StepTimer` around ``step(i)``, for code that times a function rather than
    showing its loop (the benchmark, one forward pass, one attention call).

    Calls ``step(-1)``, ``step(-2)``, ... for ``warmup`` untimed then ``step(0)`` ...
    ``step(n_steps - 1)`` timed. Returns the timing and what the timed steps returned (e.g.
    losses as Python floats, so no graph is kept alive). ``keep_all=False`` keeps only the last
    step's result, so that timed forward passes do not hold every output and the peak memory
    read afterwards is one pass's, not all of them. ``budget_s``: stop early, after at least 3
    timed steps, once the timed steps took that many seconds (a slow mode gets fewer samples).
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be at least 1, got {n_steps}")
    timer = StepTimer(device, warmup)
    for i in range(warmup):
        with timer.step():
            step(-1 - i)
    results: list[object] = []
    for i in tqdm(range(n_steps), desc=desc, disable=not progress):
        with timer.step():
            result = step(i)
        last = i == n_steps - 1 or (budget_s is not None and len(timer.samples) >= 3
                                    and sum(timer.samples) > budget_s)
        if keep_all or last:
            results.append(result)
        del result  # with keep_all=False, the last output is the only one kept
        if last:
            break
    return timer.timing, results


@contextmanager
def fresh_compile_cache() -> Iterator[str]:
    """Compile cold inside this block: no compiled code from before is reused.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` at every compile (default
    ``/tmp/torchinductor_<user>``), and its FX-graph and AOTAutograd caches are on by default:
    without this, a second run of the same model times a cache hit, not a compile. The block
    points that variable at a new empty folder and clears the in-memory caches
    (``torch.compiler.reset()``), so a notebook cell run twice compiles twice. On exit the folder
    is removed and the variable restored.
    """
    before = os.environ.get(CACHE_VARIABLE)
    with tempfile.TemporaryDirectory(prefix="amp_tutorial_inductor_") as folder:
        os.environ[CACHE_VARIABLE] = folder
        torch.compiler.reset()
        try:
            yield folder
        finally:
            if before is None:
                os.environ.pop(CACHE_VARIABLE, None)
            else:
                os.environ[CACHE_VARIABLE] = before


def saved_activation_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs (e.g. a forward + loss).

    Storage shared by several saved tensors (a weight saved by two ops) is counted once. Storages
    are told apart by identity, not address, so fake tensors (which have no data) count too.
    The hook hands autograd a detached tensor: returning the tensor itself makes a reference cycle
    (an op that saves its own output then holds itself) that no garbage collection frees, so every
    call leaked the saved activations (``saved_tensors_hooks``' warning, torch/autograd/graph.py).
    """
    seen: dict[int, tuple[torch.UntypedStorage, int]] = {}  # id -> (storage kept alive, bytes)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()  # the same Python object for every view of it
        seen[id(storage)] = (storage, storage.nbytes())
        return tensor.detach()  # same storage, no reference back to the graph

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(nbytes for _, nbytes in seen.values())


def activation_output_bytes(model: torch.nn.Module, fn: Callable[[], object]) -> int:
    """Bytes of every leaf module's output while ``fn()`` runs: the activations a forward produces.

    Works under ``torch.inference_mode``, where nothing is saved for backward.
    """
    total = 0

    def hook(_module: torch.nn.Module, _inputs: object, output: object) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        fn()
    finally:
        for handle in handles:
            handle.remove()
    return total


def op_dtype_rows(events: object, min_tensor_inputs: int = 1) -> list[dict[str, object]]:
    """Ops from a ``torch.profiler`` run made with ``record_shapes=True``, grouped by op name and
    the dtypes of their tensor inputs: calls and self time (CPU-side, microseconds).

    Shows which ops really ran in low precision and which in float32.
    """
    rows: dict[tuple[str, str], dict[str, object]] = {}
    for event in events:  # prof.events(): one FunctionEvent per op call
        dtypes = [d for d, shape in zip(event.input_dtypes, event.input_shapes, strict=False)
                  if shape and d not in ("Scalar", "ScalarList", "")]
        if len(dtypes) < min_tensor_inputs or not event.name.startswith("aten::"):
            continue
        key = (event.name, ", ".join(_short_dtype(d) for d in dtypes))
        row = rows.setdefault(key, {"op": key[0], "input dtypes": key[1], "calls": 0,
                                    "self time (us)": 0.0})
        row["calls"] += 1
        row["self time (us)"] += event.self_cpu_time_total
    return sorted(rows.values(), key=lambda r: -r["self time (us)"])


def optimizer_step_events(events: object) -> list[object]:
    """The op calls made inside ``optimizer.step()`` of a ``torch.profiler`` run: every
    ``torch.optim`` optimizer wraps its step in an ``Optimizer.step#<Class>.step`` range, and its
    ops are that range's descendants.
    """
    found: list[object] = []

    def walk(event: object) -> None:
        for child in event.cpu_children:
            found.append(child)
            walk(child)

    for event in events:
        if event.name.startswith("Optimizer.step#"):
            walk(event)
    return found


def _short_dtype(profiler_dtype: str) -> str:
    names = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64",
             "long int": "int64", "bool": "bool", "int": "int32"}
    return names.get(profiler_dtype, profiler_dtype)
