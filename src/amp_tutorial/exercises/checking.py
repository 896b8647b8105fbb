"""What every exercise checker shares: running the learner's code safely, and naming mistakes.

A checker runs the learner's function on one or more small CPU *scenarios* (a float16 run, a
bfloat16 run, a simulated GPU, ...). Each run is an :func:`attempt`: the learner's exception or a
run past the time limit becomes a :class:`Problem` in plain words, never a traceback from the
checker. The checker's *rules* turn what it observed into problems, each with a stable ``key``
(the tests name mistakes by it) and a message that says what is wrong, why it matters and what to
write instead. :func:`collect` merges the problems of all scenarios into one
:class:`CheckResult`, each message prefixed with the scenarios it showed up in.

What a call must leave as it found (the global autocast switches and dtypes, the default dtype,
grad mode, the caller's models, lists and tensors) is checked in one place, :func:`left_behind`,
for every checker: a solution is judged by the world after the call, not only by its return value.

Adding an exercise means writing its scenarios and rules, and an :class:`Exercise` (lesson, name,
praise) whose :meth:`Exercise.check` runs them; the running, the time limit, the wrong return type,
the report and the record of the attempt (``amp_tutorial.progress``) come from here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from unittest import mock

import torch
from torch import nn

from amp_tutorial.progress import record_attempt

RAISED = "raised"
TIMED_OUT = "timed-out"
WRONG_RETURN = "wrong-return"
# What a call left behind (:func:`left_behind`): one key per kind, the same in every checker.
AUTOCAST_LEFT_CHANGED = "autocast-state-left-changed"
DEFAULT_DTYPE_LEFT_CHANGED = "default-dtype-left-changed"
GRAD_MODE_LEFT_CHANGED = "grad-mode-left-changed"
MODEL_MODE_CHANGED = "model-mode-changed"
MODEL_DTYPE_CHANGED = "model-weights-dtype-changed"
CALLER_LIST_CHANGED = "caller-list-changed"
INPUT_CHANGED = "input-changed-in-place"
STATE_KEYS = (AUTOCAST_LEFT_CHANGED, DEFAULT_DTYPE_LEFT_CHANGED, GRAD_MODE_LEFT_CHANGED,
              MODEL_MODE_CHANGED, MODEL_DTYPE_CHANGED, CALLER_LIST_CHANGED, INPUT_CHANGED)
AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")  # each has its own autocast switch
TIME_LIMIT_S = 10.0  # a correct answer needs well under a second on a laptop CPU
S = TypeVar("S")  # an exercise's scenario type


@dataclass(frozen=True)
class Problem:
    """One mistake: a stable ``key`` (for tests) and a plain-words ``message`` (for the learner)."""

    key: str
    message: str

    @classmethod
    def named(cls, key: str, what: str, why: str, fix: str) -> Problem:
        """The house style: what is wrong, why it matters, what to write instead."""
        return cls(key, f"{what} {why} Instead: {fix}")


@dataclass
class CheckResult:
    """What a checker found; ``passed`` is True when it found nothing wrong.

    ``praise`` is what to print when it passed: which parts were checked, in one sentence.
    """

    problems: list[Problem] = field(default_factory=list)
    praise: str = "All checks passed."

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def keys(self) -> set[str]:
        return {p.key for p in self.problems}

    def __str__(self) -> str:
        if self.passed:
            return self.praise
        lines = [f"{len(self.problems)} problem(s) found:"]
        lines += [f"  {i}. {p.message}" for i, p in enumerate(self.problems, 1)]
        return "\n".join(lines)


class LearnerTimeout(Exception):
    """The learner's code ran past the checker's time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`LearnerTimeout` in the running code after ``seconds`` (wall clock).

    Uses SIGALRM, which only the main thread can take: a Jupyter kernel and pytest run cells and
    tests there. Elsewhere (another thread, Windows) the code runs without a limit.
    """
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise LearnerTimeout(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Attempt:
    """One call of the learner's function: what it returned, or the error it raised."""

    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, LearnerTimeout)


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Attempt:
    """Call ``fn(*args, **kwargs)`` under :data:`TIME_LIMIT_S` (read at each call); its exception
    is kept, not raised."""
    start = time.perf_counter()
    result = Attempt()
    try:
        with time_limit(TIME_LIMIT_S):
            result.value = fn(*args, **kwargs)
    except Exception as error:  # the learner's bug, reported rather than raised
        result.error = error
    result.seconds = time.perf_counter() - start
    return result


def error_problem(run: Attempt, name: str, after_others: bool = False) -> Problem | None:
    """The plain-words problem for a run that raised or ran too long (None if it returned).

    ``after_others``: other problems were found in the same run, so the error is probably their
    consequence (GradScaler refusing a call order, say) and is reported as such.
    """
    if run.error is None:
        return None
    if run.timed_out:
        return Problem.named(
            TIMED_OUT, f"{name} was still running after {run.seconds:.0f} seconds, so the "
            "checker stopped it.", "A correct answer finishes in well under a second here; a "
            "loop that never ends (a `while` whose condition never changes, or iterating over "
            "something that grows) is the usual cause.", "make every loop run a fixed number of "
            "times, e.g. `for epoch in range(epochs):`.")
    cause = " (probably a consequence of the mistake named above)" if after_others else ""
    return Problem(RAISED, f"{name} raised {type(run.error).__name__}{cause}: {run.error}")


def type_problem(value: Any, expected: type | tuple[type, ...], name: str, what: str,
                 fix: str) -> Problem | None:
    """A :data:`WRONG_RETURN` problem if ``value`` is not an instance of ``expected``."""
    if isinstance(value, expected):
        return None
    return Problem.named(
        WRONG_RETURN, f"{name} returned {type(value).__name__} ({value!r:.80}) where {what} "
        "was expected.", "The code that uses the answer needs exactly that type.", fix)


@dataclass
class _World:
    """What a call must leave as it found: global settings, and the caller's objects."""

    autocast: dict[str, tuple[bool, torch.dtype]]
    default_dtype: torch.dtype
    grad_enabled: bool
    modes: dict[str, list[bool]]  # model name -> each submodule's `training`
    weight_dtypes: dict[str, list[torch.dtype]]  # model name -> each parameter's dtype
    lists: dict[str, list[Any]]  # list name -> a shallow copy of its items
    tensors: dict[str, torch.Tensor]  # tensor name -> a copy of its values

    @classmethod
    def now(cls, models: dict[str, nn.Module], lists: dict[str, list],
            tensors: dict[str, torch.Tensor]) -> _World:
        return cls({t: (torch.is_autocast_enabled(t), torch.get_autocast_dtype(t))
                    for t in AUTOCAST_DEVICE_TYPES},
                   torch.get_default_dtype(), torch.is_grad_enabled(),
                   {n: [m.training for m in model.modules()] for n, model in models.items()},
                   {n: [p.dtype for p in model.parameters()] for n, model in models.items()},
                   {n: list(items) for n, items in lists.items()},
                   {n: t.detach().clone() for n, t in tensors.items()})

    def restore_globals(self) -> None:
        for device_type, (enabled, dtype) in self.autocast.items():
            torch.set_autocast_enabled(device_type, enabled)
            torch.set_autocast_dtype(device_type, dtype)
        torch.set_default_dtype(self.default_dtype)
        torch.set_grad_enabled(self.grad_enabled)


def _tensors_in(name: str, value: Any) -> dict[str, torch.Tensor]:
    """The tensors in ``value`` (a tensor, or tuples and lists of them), named as indexed."""
    if isinstance(value, torch.Tensor):
        return {name: value}
    found: dict[str, torch.Tensor] = {}
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found.update(_tensors_in(f"{name}[{i}]", item))
    return found


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(torch.nan_to_num(a.detach()), torch.nan_to_num(b))
            and bool((a.detach().isnan() == b.isnan()).all()))


def _state_problems(name: str, before: _World, after: _World, lists: dict[str, list],
                    tensors: dict[str, torch.Tensor]) -> list[Problem]:
    found = []
    switched = [f'"{t}": {"on" if after.autocast[t][0] else "off"} in {after.autocast[t][1]}'
                f' (was {"on" if was[0] else "off"} in {was[1]})'
                for t, was in before.autocast.items() if after.autocast[t] != was]
    if switched:
        found.append(Problem.named(
            AUTOCAST_LEFT_CHANGED, f"After {name} returned, autocast's global state was changed "
            f"({'; '.join(switched)}).", "Autocast's switch and dtype are global, one per device "
            "type: whatever runs after your function (the caller's evaluation, the next step, "
            "other code) now runs with the autocast you left, or without the one it had. "
            "torch.set_autocast_enabled / set_autocast_dtype, or a torch.autocast entered with "
            "__enter__() and never exited, do this.", "use autocast only as a `with "
            "torch.autocast(...):` block, which restores the previous state when it ends."))
    if after.default_dtype != before.default_dtype:
        found.append(Problem.named(
            DEFAULT_DTYPE_LEFT_CHANGED, f"After {name} returned, torch's default dtype was "
            f"{after.default_dtype}, not {before.default_dtype}.", "torch.set_default_dtype is "
            "global: every float tensor and every model created afterwards, anywhere in the "
            "program, is made in that dtype. Mixed precision keeps the weights in float32 and "
            "lets autocast pick the dtype per op.", "never call torch.set_default_dtype; use "
            "torch.autocast for the forward pass, or .to(dtype) on the one tensor that needs it."))
    if after.grad_enabled != before.grad_enabled:
        now, was = ("on" if on else "off" for on in (after.grad_enabled, before.grad_enabled))
        found.append(Problem.named(
            GRAD_MODE_LEFT_CHANGED, f"After {name} returned, gradient tracking was {now}, not "
            f"{was}.",
            "torch.set_grad_enabled is global: the caller's next forward pass records no graph "
            "(or records one it did not ask for).", "use `with torch.no_grad():` around the part "
            "that needs it; it restores the previous state when it ends."))
    for model, modes in before.modes.items():
        now = after.modes[model]
        if now != modes:
            state = ("eval" if not any(now) else "train" if all(now) else "mixed train/eval")
            found.append(Problem.named(
                MODEL_MODE_CHANGED, f"After {name} returned, the {model} was left in {state} mode "
                f"(it was in {'train' if all(modes) else 'eval' if not any(modes) else 'mixed'} "
                "mode).", "model.eval() and model.train() switch dropout and BatchNorm for every "
                "later call: the caller trains, or evaluates, with the layers in the wrong mode.",
                "leave the model's mode as you found it; if you must switch it, switch it back "
                "(`was = model.training ... model.train(was)`)."))
    for model, dtypes in before.weight_dtypes.items():
        now = after.weight_dtypes[model]
        if now != dtypes:
            changed = sorted({str(d) for d, was in zip(now, dtypes, strict=False) if d != was})
            found.append(Problem.named(
                MODEL_DTYPE_CHANGED, f"After {name} returned, the {model}'s weights were in "
                f"{', '.join(changed) or 'another dtype'}, not float32.", "Mixed precision "
                "keeps the weights (and their gradients and the optimizer's state) in float32: "
                "autocast casts copies of them per op. model.half() or model.to(torch.bfloat16) "
                "rounds every weight, and updates smaller than the spacing of 16-bit numbers "
                "then round away.", "leave the model's dtype alone; put the forward pass inside "
                "`with torch.autocast(device_type=..., dtype=...):`."))
    for lst, items in before.lists.items():
        now = lists[lst]
        if len(now) != len(items) or any(a is not b for a, b in zip(now, items, strict=False)):
            how = (f"{len(items)} items before, {len(now)} after" if len(now) != len(items)
                   else "items replaced")
            found.append(Problem.named(
                CALLER_LIST_CHANGED, f"After {name} returned, the caller's list `{lst}` had "
                f"changed ({how}).",
                "The caller still holds that list: .pop(), .clear(), del or item assignment "
                "change it for the next epoch or the next call, which then gets fewer (or other) "
                "batches.", "read the list without changing it: iterate over it, or slice it "
                "(`items[start:start + k]` is a new list)."))
    changed = [n for n, t in tensors.items() if not _same_tensor(t, before.tensors[n])]
    if changed:
        found.append(Problem.named(
            INPUT_CHANGED, f"{name} changed its input {', '.join(changed[:4])}"
            f"{' and more' if len(changed) > 4 else ''} in place.", "The caller still holds "
            "these tensors: an in-place change (x.mul_(s), x *= s, x.div_(...), masked_fill_, "
            "x[...] = ...) alters its data, so the next call, the next epoch or the caller's "
            "own use of them sees other values, and on a tensor that requires grad autograd "
            "refuses it.", "compute new tensors: x = x * s (not x *= s), x.masked_fill(...) "
            "(no trailing underscore), x.float() or x.clone() before changing a copy."))
    return found


@contextlib.contextmanager
def autocast_regions() -> Iterator[list[tuple[str, bool, str]]]:
    """Every ``torch.autocast`` region the code inside enters, as (device type, enabled, class
    name): the old ``torch.cuda.amp.autocast`` spellings enter through it too. The list fills as
    the code runs."""
    regions: list[tuple[str, bool, str]] = []
    original = torch.amp.autocast_mode.autocast.__enter__

    def enter(region):  # noqa: ANN001, ANN202
        kind = type(region)
        regions.append((region.device, bool(region._enabled),
                        f"{kind.__module__}.{kind.__qualname__}"))
        return original(region)

    with mock.patch.object(torch.amp.autocast_mode.autocast, "__enter__", enter):
        yield regions


@contextlib.contextmanager
def left_behind(name: str, *, models: dict[str, nn.Module] | None = None,
                lists: dict[str, list] | None = None, tensors: dict[str, Any] | None = None,
                ) -> Iterator[list[Problem]]:
    """Check what the code run inside the block left behind; yields the list its problems go
    in, filled when the block ends.

    ``name``: the learner's function, for the messages; ``models``, ``lists``, ``tensors``: the
    caller's objects by the name the messages give them (tensors may be nested in tuples and
    lists; a list's tensors are checked too). The global state (autocast per device type, the
    default dtype, grad mode) is put back afterwards, so one mistake is named once and does not
    leak into the next scenario or the caller.
    """
    models, lists = models or {}, lists or {}
    watched: dict[str, torch.Tensor] = {}
    for n, value in {**(tensors or {}), **lists}.items():
        watched.update(_tensors_in(n, value))
    before = _World.now(models, lists, watched)
    problems: list[Problem] = []
    try:
        yield problems
    finally:
        after = _World.now(models, lists, {})
        before.restore_globals()
        problems += _state_problems(name, before, after, lists, watched)


def collect(found: Iterable[tuple[str, Iterable[Problem]]], praise: str) -> CheckResult:
    """One result from ``(scenario name, problems)`` pairs: each problem once, its message
    prefixed with the scenarios it was found in, in the order first found."""
    first: dict[str, Problem] = {}
    where: dict[str, list[str]] = {}
    for scenario, problems in found:
        for problem in problems:
            first.setdefault(problem.key, problem)
            if scenario not in where.setdefault(problem.key, []):
                where[problem.key].append(scenario)
    result = CheckResult(praise=praise)
    for key, problem in first.items():
        result.problems.append(Problem(key, f"[{', '.join(where[key])}] {problem.message}"))
    return result


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: where it is (lesson, name: what the progress record says) and what
    its checker prints when nothing is wrong. :meth:`check` is the one place every checker ends:
    the scenario loop, the merged report, and the record of the attempt."""

    lesson: str  # "05": the lesson the exercise is in
    name: str  # "train_accumulated": the learner's function, as the record names it
    praise: str  # what a passing check prints

    def check(self, scenarios: Iterable[S], problems_of: Callable[[S], list[Problem]],
              name_of: Callable[[S], str] = lambda scenario: scenario.name) -> CheckResult:
        """Run ``problems_of`` on each scenario in turn (stopping after one that ran past the
        time limit: one endless loop is enough to wait for), then :meth:`report`."""
        found = []
        for scenario in scenarios:
            problems = problems_of(scenario)
            found.append((name_of(scenario), problems))
            if any(p.key == TIMED_OUT for p in problems):
                break
        return self.report(found)

    def report(self, found: Iterable[tuple[str, Iterable[Problem]]],
               praise: str | None = None) -> CheckResult:
        """:func:`collect` the problems into one result and record the attempt."""
        result = collect(found, self.praise if praise is None else praise)
        record_attempt(self.lesson, self.name, result.passed, result.keys, str(result))
        return result
