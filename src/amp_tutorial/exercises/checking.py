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
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar
from unittest import mock

import torch
from torch import nn

from amp_tutorial.progress import read_attempts, record_attempt

RAISED = "raised"
TIMED_OUT = "timed-out"
UNFINISHED = "not-written-yet"  # the exercise's stub still raises NotImplementedError
WRONG_RETURN = "wrong-return"
# What a call left behind (:func:`left_behind`): one key per kind, the same in every checker.
AUTOCAST_LEFT_CHANGED = "autocast-state-left-changed"
DEFAULT_DTYPE_LEFT_CHANGED = "default-dtype-left-changed"
GRAD_MODE_LEFT_CHANGED = "grad-mode-left-changed"
MODEL_MODE_CHANGED = "model-mode-changed"
MODEL_DTYPE_CHANGED = "model-weights-dtype-changed"
CALLER_LIST_CHANGED = "caller-list-changed"
INPUT_CHANGED = "input-changed-in-place"
SETTING_LEFT_CHANGED = "torch-setting-left-changed"  # any other global setting (SETTINGS)
STATE_KEYS = (AUTOCAST_LEFT_CHANGED, DEFAULT_DTYPE_LEFT_CHANGED, GRAD_MODE_LEFT_CHANGED,
              MODEL_MODE_CHANGED, MODEL_DTYPE_CHANGED, CALLER_LIST_CHANGED, INPUT_CHANGED,
              SETTING_LEFT_CHANGED)
AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")  # each has its own autocast switch
TIME_LIMIT_S = 10.0  # a correct answer needs well under a second on a laptop CPU
CHECK_BUDGET_S = 20.0  # all of one check's calls of the learner's function together
FIX = " Instead: "  # what a message says after the mistake: shown once it is named again
NAMED_AGAIN = ("Change your code and check again: a mistake that is still there is named again, "
               "with what to write instead.")
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

    reveal: set[str] = field(default_factory=set)  # keys whose fix is shown (named before)

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
        lines += [f"  {i}. {self.shown(p)}" for i, p in enumerate(self.problems, 1)]
        if any(self.shown(p) != p.message for p in self.problems):
            lines.append(NAMED_AGAIN)
        return "\n".join(lines)

    def shown(self, problem: Problem) -> str:
        """What the learner reads of a problem: what is wrong, where and why; what to write
        instead only when the same mistake was named at the previous check of this exercise, so
        that a first answer is thought about before it is pasted."""
        if problem.key in self.reveal:
            return problem.message
        return problem.message.partition(FIX)[0]


class LearnerTimeout(Exception):
    """The learner's code ran past the checker's time limit."""


@dataclass
class _Budget:
    """What one check has left of :data:`CHECK_BUDGET_S` for the learner's calls."""

    left_s: float


_BUDGET: ContextVar[_Budget | None] = ContextVar("amp_tutorial_check_budget", default=None)


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

    @property
    def ends_check(self) -> bool:
        """A run after which the other scenarios would only say the same (:func:`stops`): past
        the time limit, or the stub not written yet."""
        return self.timed_out or isinstance(self.error, NotImplementedError)


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Attempt:
    """Call ``fn(*args, **kwargs)`` under :data:`TIME_LIMIT_S` (read at each call), and within
    what the running check has left of its :data:`CHECK_BUDGET_S` (:meth:`Exercise.checker`):
    the scenarios and simulated devices of one check share one budget. Its exception is kept,
    not raised."""
    budget = _BUDGET.get()
    limit = TIME_LIMIT_S if budget is None else min(TIME_LIMIT_S, budget.left_s)
    result = Attempt()
    if limit <= 0:
        result.error = LearnerTimeout("the check's time for your function was used up")
        return result
    start = time.perf_counter()
    try:
        with time_limit(limit):
            result.value = fn(*args, **kwargs)
    except Exception as error:  # the learner's bug, reported rather than raised
        result.error = error
    result.seconds = time.perf_counter() - start
    if budget is not None:
        budget.left_s -= result.seconds
    return result


# GradScaler's internal checks (AssertionError, torch/amp/grad_scaler.py, the same words in torch
# 2.9, 2.11 and 2.14) that a wrong call order trips, in plain words: torch's text is never shown
# as a finding, and where a mistake named beside it explains the error, only that mistake is
SCALER_ASSERTS = {
    "No inf checks were recorded prior to update": "scaler.update() ran with no "
    "scaler.step(optimizer) since the last update",
    "No inf checks were recorded for this optimizer": "scaler.step(optimizer) found no "
    "gradients to unscale (they were None)",
    "but _scale is None": "a scaler call came before any scaler.scale(loss)",
}


def scaler_assert(error: BaseException | None) -> str | None:
    """What GradScaler's internal check ``error`` means in plain words, or None if it is not one.
    """
    if not isinstance(error, AssertionError):
        return None
    return next((plain for words, plain in SCALER_ASSERTS.items() if words in str(error)), None)


def error_problem(run: Attempt, name: str, after_others: bool = False) -> Problem | None:
    """The plain-words problem for a run that raised or ran too long (None if it returned).

    ``after_others``: other problems were found in the same run, so the error is probably their
    consequence (GradScaler refusing a call order, say) and is reported as such; one of
    GradScaler's internal checks (``SCALER_ASSERTS``) is then not reported at all.
    """
    if run.error is None:
        return None
    if isinstance(run.error, NotImplementedError):  # the exercise's stub, as the lesson left it
        return Problem.named(
            UNFINISHED, f"{name} is not written yet: it raised NotImplementedError "
            f"({run.error}).", "The checker runs it beside the reference answer once it "
            "returns.", "replace the `raise NotImplementedError(...)` line with your code.")
    if plain := scaler_assert(run.error):
        if after_others:
            return None
        return Problem.named(
            RAISED, f"{name} stopped inside GradScaler: {plain}.", "GradScaler checks the order "
            "of its calls in each iteration: scale(loss) and backward, unscale_(optimizer) only "
            "to clip, then step(optimizer) and update().", "call them in that order, each once "
            "per iteration.")
    why = ("A correct answer finishes in well under a second here; a loop that never ends (a "
           "`while` whose condition never changes, or iterating over something that grows) is "
           "the usual cause.")
    if run.timed_out and not run.seconds:  # not run: the check's budget was spent already
        return Problem.named(
            TIMED_OUT, f"{name} had used up the {CHECK_BUDGET_S:g} seconds this check gives it "
            "over all its runs, so the checker stopped.", why,
            "make every loop run a fixed number of times.")
    if run.timed_out:
        return Problem.named(
            TIMED_OUT, f"{name} was still running after {run.seconds:.0f} seconds, so the "
            "checker stopped it.", why, "make every loop run a fixed number of times.")
    cause = " (probably a consequence of the mistake named above)" if after_others else ""
    return Problem(RAISED, f"{name} raised {type(run.error).__name__}{cause}: {run.error}")


def stops(problems: Iterable[Problem]) -> bool:
    """Whether the other scenarios would only say these problems again, so a check stops here:
    a run past the time limit (one endless loop is enough to wait for), or a stub not written
    yet (it would raise the same in every scenario)."""
    return any(p.key in (TIMED_OUT, UNFINISHED) for p in problems)


def type_problem(value: Any, expected: type | tuple[type, ...], name: str, what: str,
                 fix: str) -> Problem | None:
    """A :data:`WRONG_RETURN` problem if ``value`` is not an instance of ``expected``."""
    if isinstance(value, expected):
        return None
    return Problem.named(
        WRONG_RETURN, f"{name} returned {type(value).__name__} ({value!r:.80}) where {what} "
        "was expected.", "The code that uses the answer needs exactly that type.", fix)


@dataclass(frozen=True)
class Setting:
    """One global torch setting a learner's function could leave changed: how to read it, how to
    put it back, and what to write instead of changing it for good."""

    name: str  # as the learner would write it
    read: Callable[[], Any]
    write: Callable[[Any], None]
    instead: str = "leave it as you found it: none of the exercises needs it changed."


def _attribute(path: str, instead: str = Setting.instead) -> Setting:
    """A setting that is an attribute, ``torch.backends.cudnn.benchmark`` say."""
    owner_path, _, attr = path.rpartition(".")

    def owner() -> Any:
        obj: Any = torch
        for part in owner_path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    return Setting(path, lambda: getattr(owner(), attr), lambda v: setattr(owner(), attr, v),
                   instead)


def _sdpa(kind: str) -> Setting:
    cuda = torch.backends.cuda
    return Setting(f"torch.backends.cuda.enable_{kind}_sdp", getattr(cuda, f"{kind}_sdp_enabled"),
                   getattr(cuda, f"enable_{kind}_sdp"),
                   "choose SDPA's kernels for one block: `with torch.nn.attention.sdpa_kernel("
                   "...):`, which puts the flags back when it ends.")


def _flushes_denormals() -> bool:
    """Whether ``torch.set_flush_denormal(True)`` is in force (it has no getter): a subnormal
    float64 then becomes 0 (its documentation's example)."""
    return torch.tensor(1e-323, dtype=torch.float64).item() == 0.0


def _nesting() -> int:
    depth = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return depth


def _set_nesting(depth: int) -> None:
    while _nesting() > depth:
        torch.autocast_decrement_nesting()
    while _nesting() < depth:
        torch.autocast_increment_nesting()


# Every other global setting a call is checked for (autocast per device type, the default dtype
# and grad mode have keys of their own). The TF32 switches are read through the per-backend
# ``fp32_precision`` settings where torch has them (2.9 on): there the old ``allow_tf32`` getters
# are derived from them and can raise once only the new ones were set. Settings this torch does
# not have are left out (:func:`_readable`).
SETTINGS: tuple[Setting, ...] = (
    Setting("torch.set_float32_matmul_precision", torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision, "leave fp32 matmuls as the caller set them; "
            "TF32 or bf16 matmuls in fp32 code are a choice for the whole program, not for "
            "one function."),
    *(_attribute(f"torch.backends.{path}.fp32_precision") for path in (
        "", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul",
        "mkldnn.conv", "mkldnn.rnn")),
    _attribute("torch.backends.cuda.matmul.allow_tf32"),
    _attribute("torch.backends.cudnn.allow_tf32"),
    _attribute("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
    _attribute("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"),
    _attribute("torch.backends.cudnn.benchmark"),
    _attribute("torch.backends.cudnn.deterministic"),
    _attribute("torch.backends.cudnn.enabled"),
    _attribute("torch.backends.mkldnn.enabled"),
    *(_sdpa(kind) for kind in ("flash", "mem_efficient", "math", "cudnn")),
    Setting("torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp",
            lambda: torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
            lambda v: torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(v)),
    Setting("torch.set_default_device", torch.get_default_device,
            lambda v: torch.set_default_device(None if v == torch.device("cpu") else v),
            "make the tensors on the device you were given: `torch.empty(..., device=device)`, "
            "or `with torch.device(device):` for a block."),
    Setting("torch.use_deterministic_algorithms",
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    Setting("torch.autograd.set_detect_anomaly",
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda v: torch.set_anomaly_enabled(*v),
            "look for a NaN's origin in one block: `with torch.autograd.detect_anomaly():`; "
            "anomaly mode left on slows every later backward pass."),
    Setting("torch.set_autocast_cache_enabled", torch.is_autocast_cache_enabled,
            torch.set_autocast_cache_enabled),
    Setting("autocast's nesting depth (an autocast entered and never exited)", _nesting,
            _set_nesting, "use autocast only as a `with torch.autocast(...):` block."),
    _attribute("torch.backends.cuda.matmul.allow_fp16_accumulation"),  # torch 2.7 on
    Setting("torch.set_num_threads", torch.get_num_threads, torch.set_num_threads,
            "leave the CPU threads to the caller: the count holds for every later op."),
    Setting("torch.set_flush_denormal", _flushes_denormals, torch.set_flush_denormal,
            "leave subnormal numbers to the caller: flushing them to zero holds for every later "
            "op (on CPUs with SSE3)."),
)


def _readable(setting: Setting) -> bool:
    try:
        setting.read()
    except Exception:  # noqa: BLE001 - a setting this torch lacks, or cannot read here
        return False
    return True


_HERE = tuple(s for s in SETTINGS if _readable(s))
if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # the old TF32 getters are derived
    _HERE = tuple(s for s in _HERE if not s.name.endswith("allow_tf32"))


def _read_settings() -> dict[str, Any]:
    values = {}
    for setting in _HERE:
        try:
            values[setting.name] = setting.read()
        except Exception:  # noqa: BLE001 - unreadable after a change (an old getter, say)
            values[setting.name] = "(unreadable)"
    return values


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
    settings: dict[str, Any] = field(default_factory=_read_settings)  # SETTINGS, by name

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
        # the matmul precision first: it sets several of the per-backend settings at once
        for setting in _HERE:
            was = self.settings.get(setting.name)
            try:
                if setting.read() != was:
                    setting.write(was)
            except Exception:  # noqa: BLE001 - put back what can be; the change is named anyway
                continue
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
    settings = [(setting, after.settings.get(setting.name)) for setting in _HERE
                 if after.settings.get(setting.name) != before.settings.get(setting.name)
                 and not (switched and setting.read is _nesting)]  # one mistake, named above
    if settings:
        found.append(Problem.named(
            SETTING_LEFT_CHANGED, f"After {name} returned, torch's global settings were changed: "
            + "; ".join(f"{s.name} is {now!r} (was {before.settings.get(s.name)!r})"
                        for s, now in settings) + ".",
            "They hold for the whole program: everything that runs afterwards (the caller's "
            "training, its evaluation, the next lesson) runs with them, and the numbers it "
            "gets change without a line of its own saying why.",
            " ".join(dict.fromkeys(s.instead for s, _ in settings))))
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
    prefixed with the scenarios it was found in (separated by semicolons: a scenario's own name
    may hold a comma), in the order first found."""
    first: dict[str, Problem] = {}
    where: dict[str, list[str]] = {}
    for scenario, problems in found:
        for problem in problems:
            first.setdefault(problem.key, problem)
            if scenario not in where.setdefault(problem.key, []):
                where[problem.key].append(scenario)
    result = CheckResult(praise=praise)
    for key, problem in first.items():
        result.problems.append(Problem(key, f"[{'; '.join(where[key])}] {problem.message}"))
    return result


@contextlib.contextmanager
def working_line(text: str) -> Iterator[None]:
    """In a notebook, show ``text`` while the block runs and take it away when it ends, so a
    check that takes a while says it is working and leaves only its answer; elsewhere (a test, a
    script) nothing is shown."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; nothing else need pay that
    if ipython is None or ipython.get_ipython() is None:
        yield
        return
    handle = ipython.display.display({"text/plain": text}, raw=True, display_id=True)
    try:
        yield
    finally:
        handle.update({"text/plain": ""}, raw=True)


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: where it is (lesson, name: what the progress record says) and what
    its checker prints when nothing is wrong. :meth:`check` is the one place every checker ends:
    the scenario loop, the merged report, and the record of the attempt."""

    lesson: str  # "05": the lesson the exercise is in
    name: str  # "train_accumulated": the learner's function, as the record names it
    praise: str  # what a passing check prints
    loops: str = ""  # where this exercise's answer loops, for a run past the time limit

    def checker(self, check: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
        """The exercise's ``check_*`` function, run with one :data:`CHECK_BUDGET_S` for all of
        its calls of the learner's code (scenarios and simulated devices alike)."""
        @functools.wraps(check)
        def within_budget(*args: Any, **kwargs: Any) -> CheckResult:
            token = _BUDGET.set(_Budget(CHECK_BUDGET_S))
            try:
                with working_line(f"Checking {self.name}: running it beside the reference "
                                  "answer in each scenario (the first check after the kernel "
                                  "starts takes longest)..."):
                    return check(*args, **kwargs)
            finally:
                _BUDGET.reset(token)
        return within_budget

    def check(self, scenarios: Iterable[S], problems_of: Callable[[S], list[Problem]],
              name_of: Callable[[S], str] = lambda scenario: scenario.name) -> CheckResult:
        """Run ``problems_of`` on each scenario in turn (stopping where :func:`stops` says the
        rest would only repeat it), then :meth:`report`."""
        found = []
        for scenario in scenarios:
            problems = problems_of(scenario)
            found.append((name_of(scenario), problems))
            if stops(problems):
                break
        return self.report(found)

    def report(self, found: Iterable[tuple[str, Iterable[Problem]]],
               praise: str | None = None) -> CheckResult:
        """:func:`collect` the problems into one result and record the attempt. A run past the
        time limit says where this exercise loops; a mistake the previous check of this exercise
        named too shows what to write instead (:meth:`CheckResult.shown`)."""
        result = collect(found, self.praise if praise is None else praise)
        if self.loops:
            result.problems = [
                Problem(p.key, f"{p.message.partition(FIX)[0]}{FIX}look at {self.loops}.")
                if p.key == TIMED_OUT else p for p in result.problems]
        result.reveal = self.named_last_time()
        record_attempt(self.lesson, self.name, result.passed, result.keys, str(result))
        return result

    def named_last_time(self) -> set[str]:
        """The mistakes the learner's previous check of this exercise named (none if it is the
        first, or the record cannot be read)."""
        mine = [r for r in read_attempts()
                if r.get("lesson") == self.lesson and r.get("exercise") == self.name]
        return set(mine[-1].get("keys", ())) if mine else set()
