"""What every exercise checker shares: running the learner's code safely, and naming mistakes.

A checker runs the learner's function on one or more small CPU *scenarios* (a float16 run, a
bfloat16 run, a simulated GPU, ...). Each run is an :func:`attempt`: the learner's exception or a
run past the time limit becomes a :class:`Problem` in plain words, never a traceback from the
checker. The checker's *rules* turn what it observed into problems, each with a stable ``key``
(the tests name mistakes by it) and a message that says what is wrong, why it matters and what to
write instead. :func:`collect` merges the problems of all scenarios into one
:class:`CheckResult`, each message prefixed with the scenarios it showed up in.

Adding an exercise means writing its scenarios and rules; the running, the time limit, the wrong
return type and the report come from here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from amp_tutorial.progress import record_attempt

RAISED = "raised"
TIMED_OUT = "timed-out"
WRONG_RETURN = "wrong-return"
TIME_LIMIT_S = 10.0  # a correct answer needs well under a second on a laptop CPU


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


def report(result: CheckResult, lesson: str, exercise: str) -> CheckResult:
    """Record the check in the learner's progress (``amp_tutorial.progress``) and return it."""
    record_attempt(lesson, exercise, result.passed, result.keys, str(result))
    return result
