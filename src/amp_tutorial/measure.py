"""Measuring time and memory correctly on any device.

- the device is synchronised before every clock read (GPU work is asynchronous);
- warm-up steps run untimed (cuDNN/MIOpen pick kernels on first use);
- every step is timed, and the median and spread are reported, not one total;
- peak memory is reset before each run and read from the caching allocator where there is one;
- the bytes autograd saves for backward are counted exactly with saved_tensors_hooks, on every
  device, CPU included, and split into activations (what AMP halves), autocast's cast weights
  (what AMP adds) and parameters saved as they are (memory that exists in every mode);
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


def step_peak(step: Callable[[], object], device: torch.device | str) -> tuple[object, int | None]:
    """Call ``step()`` once more with the allocator's peak reset before it: what it returned and
    the peak in bytes over that call (None without allocator stats, as on a CPU). Whatever else
    is resident (other runs' models, a comparison's twins) counts in the peak as it does in a
    real program."""
    reset_peak_memory(device)
    result = step()
    return result, peak_memory_bytes(device)


def thread_cpu_stats() -> dict[int, tuple[float, float]] | None:
    """Per live thread of this process: (seconds it ran on a CPU, seconds it waited for one:
    runnable, but another program, or another of its own threads, held the core), from the
    first two fields of Linux's ``/proc/self/task/<tid>/schedstat``. None where the kernel
    keeps no per-thread schedstat (macOS, Windows, a kernel without schedstats).

    A busy machine slows a run in a way its spread can miss: a job beside it for the whole run
    makes every step slower by about as much, so the steps agree and the median is wrong. The
    wait shows it (a thread that waited 40 ms for a CPU in a 100 ms step lost them to someone
    else).
    """
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    stats: dict[int, tuple[float, float]] = {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                ran, waited = f.read().split()[:2]
            stats[int(task)] = (int(ran) / 1e9, int(waited) / 1e9)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile, or no schedstat in this kernel
    return stats or None  # this thread is always live: nothing read means nothing kept


def cpu_wait_s() -> float | None:
    """Seconds this process's live threads have waited for a CPU so far, summed over them
    (``thread_cpu_stats``); None where that is not kept."""
    stats = thread_cpu_stats()
    return None if stats is None else sum(waited for _, waited in stats.values())


def waited_between(before: dict[int, tuple[float, float]],
                   after: dict[int, tuple[float, float]]) -> tuple[float, int]:
    """What this process's threads waited for a CPU between two ``thread_cpu_stats`` readings
    (seconds, summed over threads) and how many threads ran (or waited to) in between. Thread by
    thread: a thread that started meanwhile counts from zero, and one that ended is left out
    (what it waited after the first reading is unknown; never a negative wait)."""
    waited, ran = 0.0, 0
    for tid, (run_after, wait_after) in after.items():
        run_before, wait_before = before.get(tid, (0.0, 0.0))
        waited += max(0.0, wait_after - wait_before)
        ran += run_after > run_before or wait_after > wait_before  # it wanted a CPU
    return waited, max(ran, 1)


def crowded(wait_share: float | None, threads: int | None = None) -> str | None:
    """Why a run whose threads each waited for a CPU ``wait_share`` of its time is no result
    (over ``CROWDED_SHARE``: other programs held the cores, or the process ran more threads than
    the CPUs it may use), or None. ``threads``: how many ran, for the sentence."""
    if wait_share is None or wait_share <= CROWDED_SHARE:
        return None
    who = {None: "threads", 1: "1 thread"}.get(threads, f"{threads} threads")
    return f"{who} waited for a CPU {wait_share:.0%} of the time"


def why_noisy(spread: float, wait_share: float | None, threads: int | None = None) -> str | None:
    """Why a timing's median says little (its IQR over its median, ``spread``, above
    ``NOISY_SPREAD``, or threads that each waited for a CPU over ``CROWDED_SHARE`` of the time),
    or None. ``Timing.why_noisy``; the check-up reads it from the figures it keeps."""
    if spread > NOISY_SPREAD:
        return f"spread is {spread:.0%} of its median"
    return crowded(wait_share, threads)


def busy(noisy: dict[str, str]) -> str:
    """The one sentence for runs that are noise: ``{run name: why_noisy}``."""
    said = " and ".join(f"{name}'s {why}" for name, why in noisy.items())
    return f"{said}, more than {NOISY_SPREAD:.0%}: the machine was busy"


@dataclass(frozen=True)
class Timing:
    """Per-step wall times in seconds, with the statistics the course reports.

    ``waits``: per step, the seconds the process's threads waited for a CPU, summed over them
    (``waited_between``); ``threads``: per step, how many threads ran. Both empty where that is
    not measured. ``cpu``: per step, the process's CPU time in seconds (all its threads; time
    spent waiting for a core is not in it).
    """

    samples: tuple[float, ...]
    waits: tuple[float, ...] = ()
    threads: tuple[int, ...] = ()
    cpu: tuple[float, ...] = ()

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
        """The share of the timed steps' wall time that each thread that ran waited for a CPU,
        on average: the summed waits over (wall time x threads), so two threads that both waited
        half the time give 0.5; None where waits were not measured. Summed over threads instead,
        the idle floor alone (about 1% per thread) would pass ``CROWDED_SHARE`` on a CPU with
        32 threads."""
        if not self.waits or self.total <= 0:
            return None
        threads = self.threads if len(self.threads) == len(self.samples) else (1,) * len(
            self.samples)
        return sum(self.waits) / sum(s * n for s, n in zip(self.samples, threads, strict=True))

    @property
    def threads_ran(self) -> int | None:
        """How many threads ran in a typical timed step (the median), None if not measured."""
        return int(statistics.median(self.threads)) if self.threads else None

    @property
    def why_noisy(self) -> str | None:
        """Why the median says little here (``why_noisy``), or None."""
        return why_noisy(self.spread, self.wait_share, self.threads_ran)

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
    or stops between them (another learner's job) moves one run and not the other. The lessons
    therefore compare steps that take turns (``interleave.PairedComparison``, which reads the
    same); this rule remains for runs timed apart.
    """

    name: str
    baseline_name: str
    timing: Timing
    baseline: Timing
    preset: str

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
        return busy(noisy) if noisy else None

    @staticmethod
    def why_no_ratio(comparisons: Iterable[Comparison]) -> str | None:
        """Why some of these comparisons (one figure's bars, one table) give no ratio, each
        run's reason said once (a noisy fp32 baseline is one reason, not one per run against
        it); None where every one states its ratio."""
        comparisons = [c for c in comparisons if c.noise]
        if not comparisons:
            return None
        noisy = {name: why for c in comparisons for name, why in c.noisy_runs.items()}
        others = [c.noise for c in comparisons if not c.noisy_runs]  # a small preset, a control
        return "; ".join(dict.fromkeys(([busy(noisy)] if noisy else []) + others))

    @property
    def stated(self) -> float | None:
        """The ratio where it can be stated, else None."""
        return None if self.noise else self.ratio

    def __str__(self) -> str:
        return comparison_words(self, f"{self.ratio:.2f}x", f"t_{self.baseline_name} / t, medians",
                                f"too noisy to compare here ({self.noise}); rerun on an idle "
                                "machine")


def comparison_words(c: Comparison, ratio: str, how: str, unstated: str) -> str:
    """The sentence for a comparison ``c`` (``name``, ``baseline_name``, ``preset``, ``ratio``,
    ``noise``): "<name> ran at <ratio> the speed of <baseline> (<change>; <how>)" where it is
    stated, "<name> against <baseline>: <unstated>" where it is not, and "not compared here" at
    an untimed preset."""
    if c.preset in UNTIMED_PRESETS:
        return (f"{c.name} against {c.baseline_name}: not compared here ({c.noise}); run at a "
                "larger preset")
    if c.noise:
        return f"{c.name} against {c.baseline_name}: {unstated}"
    change = (f"{1 - 1 / c.ratio:.0%} less time per step" if c.ratio > 1
              else f"{1 / c.ratio - 1:.0%} more time per step")
    if abs(1 / c.ratio - 1) < 0.005:  # rounds to 0%: neither more nor less
        change = "the same time per step, to the percent"
    return f"{c.name} ran at {ratio} the speed of {c.baseline_name} ({change}; {how})"


def timing_columns(timing: Timing, baseline: Timing, peak_bytes: int | None,
                   preset: str = "", comparison: object | None = None) -> dict[str, float]:
    """The columns every fp32-against-AMP results table starts with: median and IQR per step in
    ms, the speedup over the baseline (t_fp32 / t; NaN where the comparison says the timings
    cannot be compared) and the allocator's peak in MB (NaN where there is no allocator peak, as
    on a CPU). The speedup is ``comparison.stated`` where a comparison is given (e.g. an
    ``interleave.PairedComparison``), 1.0 for the baseline itself, else ``Comparison``'s rule.
    """
    if comparison is not None:
        stated = comparison.stated
    elif timing is baseline:
        stated = 1.0
    else:
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
        self.threads: list[int] = []  # threads that ran, one per timed step
        self.cpu: list[float] = []  # the process's CPU seconds, one per timed step

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time the block as one step (kept apart in ``warmup_samples`` while warming up)."""
        synchronize(self.device)
        before = thread_cpu_stats()
        start, cpu_start = time.perf_counter(), time.process_time()
        yield
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        if self.steps_seen < self.warmup:
            self.warmup_samples.append(elapsed)
            return
        self.samples.append(elapsed)
        self.cpu.append(cpu)
        after = thread_cpu_stats()
        if before is not None and after is not None:
            waited, threads = waited_between(before, after)
            self.waits.append(waited)
            self.threads.append(threads)

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
        if len(self.waits) != len(self.samples):
            return Timing(tuple(self.samples), cpu=tuple(self.cpu))
        return Timing(tuple(self.samples), tuple(self.waits), tuple(self.threads), tuple(self.cpu))


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


@dataclass(frozen=True)
class SavedBytes:
    """What autograd saved for backward during one forward, split by what it costs.

    - ``activations``: tensors the forward made (layer outputs, inputs cast by autocast);
    - ``cast_weights``: autocast's 16-bit copies of parameters (new memory: kept for backward, and
      in autocast's cast cache until the autocast block exits);
    - ``held``: parameters and buffers saved as they are (the fp32 run's weights): memory that
      exists in every mode, so no mode adds or saves it.

    ``new`` (activations + cast weights) is what a forward adds to memory until backward.
    """

    activations: int
    cast_weights: int
    held: int

    @property
    def new(self) -> int:
        return self.activations + self.cast_weights

    def __str__(self) -> str:
        return (f"{self.new / 2**20:.2f} MiB new (activations {self.activations / 2**20:.2f}, "
                f"cast weights {self.cast_weights / 2**20:.2f}; parameters and buffers saved "
                f"as they are: {self.held / 2**20:.2f})")


def saved_bytes(fn: Callable[[], object], model: torch.nn.Module | None = None) -> SavedBytes:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs (e.g. a forward +
    loss), split into activations, autocast's cast weights and memory held anyway (``SavedBytes``).

    A saved tensor is *held* when it is a parameter (a leaf that requires grad) or, given
    ``model``, one of its parameters or buffers (BatchNorm's running statistics); it is a *cast
    weight* when it is a dtype copy of a parameter (autocast's ``_to_copy`` of a weight that
    requires grad, so its ``grad_fn`` leads straight back to that leaf). A frozen parameter's
    copy has no ``grad_fn`` and counts as an activation.

    Storage shared by several saved tensors (a weight saved by two ops) is counted once. Storages
    are told apart by identity, not address, so fake tensors (which have no data) count too.
    The hook hands autograd a detached tensor: returning the tensor itself makes a reference cycle
    (an op that saves its own output then holds itself) that no garbage collection frees, so every
    call leaked the saved activations (``saved_tensors_hooks``' warning, torch/autograd/graph.py).
    """
    owned = set()
    if model is not None:
        owned = {id(t.untyped_storage()) for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, tuple[torch.UntypedStorage, int, str]] = {}  # id -> (storage, bytes, kind)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()  # the same Python object for every view of it
        if id(storage) not in seen:
            seen[id(storage)] = (storage, storage.nbytes(), _saved_kind(tensor, storage, owned))
        return tensor.detach()  # same storage, no reference back to the graph

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    total = {"activations": 0, "cast_weights": 0, "held": 0}
    for _, nbytes, kind in seen.values():
        total[kind] += nbytes
    return SavedBytes(**total)


def _saved_kind(tensor: torch.Tensor, storage: torch.UntypedStorage, owned: set[int]) -> str:
    # an op may save a view (addmm saves ``weight.t()``): judge the tensor the view is of
    base = tensor._base if tensor._base is not None else tensor
    if id(storage) in owned or (base.is_leaf and base.requires_grad):
        return "held"
    grad_fn = base.grad_fn
    if grad_fn is not None and type(grad_fn).__name__ == "ToCopyBackward0":
        source = grad_fn.next_functions[0][0] if grad_fn.next_functions else None
        if type(source).__name__ == "AccumulateGrad":  # a copy of a leaf that trains
            return "cast_weights"
    return "activations"


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
