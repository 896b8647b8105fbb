"""The spy that watches training code run: what a training-loop exercise's checker judges.

It does not read the learner's source, so any spelling of the same steps looks the same to it. It
watches, through module and optimizer hooks and wrappers around ``torch.autograd.backward`` and
the ``GradScaler`` methods: the autocast state at each forward and backward, which tensor is
backpropagated, the gradients right after each backward and between backward and the step, who
calls ``optimizer.step`` and how often per iteration (an iteration runs from one ``backward()`` to
the next), which ``GradScaler`` objects are used, and the ``GradScaler`` calls. A checker's rules
read its ``count`` and the fields below.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from unittest import mock

import torch
from torch import nn

from amp_tutorial.autocast_policy import fake_tensors
from amp_tutorial.exercises.checking import (
    AUTOCAST_DEVICE_TYPES,
    CheckResult,
    Exercise,
    Problem,
    left_behind,
    stops,
)

# The training-step mistakes more than one checker names (the spy sees them all), one key each.
FORWARD_NOT_AUTOCAST = "forward-not-autocast"
WRONG_AUTOCAST_DTYPE = "wrong-autocast-dtype"
BACKWARD_IN_AUTOCAST = "backward-in-autocast"
LOSS_NOT_SCALED = "loss-not-scaled"
GRADS_NOT_ZEROED = "grads-not-zeroed"
GRADS_ZEROED_BEFORE_STEP = "grads-zeroed-before-step"
CLIP_BEFORE_UNSCALE = "clip-before-unscale"
NOT_CLIPPED = "not-clipped"
OVER_CLIPPED = "over-clipped"
CLIPPED_WITHOUT_MAX = "clipped-without-max-grad-norm"
OPTIMIZER_STEP_DIRECT = "optimizer-step-direct"
STEPPED_TWICE = "optimizer-stepped-twice"
NO_SCALER_UPDATE = "no-scaler-update"
CLIPPED_UP = "clip-scales-gradient-up"
AUTOCAST_OTHER_DEVICE = "autocast-for-another-device"
DTYPE_BY_DEVICE = "autocast-dtype-chosen-by-device"
SHARED_KEYS = (BACKWARD_IN_AUTOCAST, CLIPPED_UP)  # what shared_problems names
SIMULATED_KEYS = (AUTOCAST_OTHER_DEVICE, DTYPE_BY_DEVICE)  # what simulated_problems names


class TrainingScenario(Protocol):
    """What the spy needs to know of a run: the autocast dtype expected and the clipping norm."""

    @property
    def amp_dtype(self) -> torch.dtype: ...

    @property
    def max_grad_norm(self) -> float | None: ...


@dataclass
class _Iteration:
    """What happened between one ``backward()`` and the next: one training iteration."""

    calls: list[str] = field(default_factory=list)  # the step calls, in order, for messages
    steps: int = 0  # scaler.step calls plus direct optimizer.step calls
    scaler_step_calls: int = 0
    scaler_steps_done: int = 0  # enabled scaler.step calls that returned
    updates: int = 0
    zeroed: bool = False  # the gradients were zeroed after backward, before the step used them


S = TypeVar("S")  # a checker's scenario type
CLIP_RTOL = 0.01  # clip_grad_norm_ leaves the norm at max_norm * norm / (norm + 1e-6)


def _norm(grads: list[torch.Tensor]) -> float:
    """The total L2 norm of ``grads``, as clip_grad_norm_ measures it (0.0 for none)."""
    if not grads:
        return 0.0
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float())
                                                 for g in grads])).item()


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values, NaN equal to NaN: an overflowing backward leaves NaN
    gradients, and ``torch.equal`` would call them changed."""
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


class TrainingSpy:
    """Watches one run of the learner's function and counts what it did at each step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scenario: TrainingScenario, device_type: str = "cpu") -> None:
        self.model, self.optimizer, self.scenario = model, optimizer, scenario
        self.device_type = device_type
        self.params = list(model.parameters())
        self.count: dict[str, int] = dict.fromkeys(
            ["forward", "forward_no_autocast", "forward_other_device", "forward_wrong_dtype",
             "backward", "backward_in_autocast", "backward_unscaled", "backward_not_zeroed",
             "scale_enabled", "scale_disabled", "unscale", "scaler_step", "update",
             "optimizer_step", "optimizer_step_direct", "modified_before_unscale",
             "not_clipped", "over_clipped", "clipped_without_limit", "clipped_up",
             "iterations_without_update", "stepped_twice", "zeroed_before_step"], 0)
        self.wrong_dtypes: set[torch.dtype] = set()
        self.scalers: list[torch.amp.GradScaler] = []  # enabled scalers seen, each object once
        self.twice_calls: list[str] = []  # the step calls of the first iteration that stepped twice
        self.scaled_output: torch.Tensor | None = None  # what the last enabled scale() returned
        self.after_backward: list[torch.Tensor | None] | None = None  # grads right after backward
        # the true gradients before any clipping: right after a backward of an unscaled loss, or
        # right after an enabled scaler's unscale_ (None while they are still scaled)
        self.pre_clip: list[torch.Tensor | None] | None = None
        self.unscaled = False  # unscale_ (explicit or inside step) ran since the last backward
        self.scaled_backward = False  # the last backward ran on an enabled scaler's output
        self.in_scaler_step = False
        self.clipped_to = 0.0  # the gradient norm of the last step clipped where it should not be
        self.clipped_from = 0.0  # its norm before the clip, where the clip made it larger
        self.iteration = _Iteration()

    # -- iterations ----------------------------------------------------------------------------
    def close_iteration(self, complete: bool) -> None:
        """Judge the iteration that just ended; ``complete`` is False when the run raised in it."""
        it = self.iteration
        if it.steps > 1:
            self.count["stepped_twice"] += 1
            self.twice_calls = self.twice_calls or it.calls
        if "optimizer.step()" in it.calls and not it.scaler_step_calls:
            self.count["optimizer_step_direct"] += 1
        if complete and it.scaler_steps_done > it.updates:
            self.count["iterations_without_update"] += 1
        self.count["zeroed_before_step"] += it.zeroed
        self.iteration = _Iteration()

    def note_zeroed(self) -> None:
        """Mark the iteration if every gradient backward produced is gone (None or all zeros)."""
        if self.after_backward is None or self.iteration.zeroed:
            return
        had = any(g is not None and bool(g.count_nonzero()) for g in self.after_backward)
        gone = all(p.grad is None or not bool(p.grad.count_nonzero()) for p in self.params)
        self.iteration.zeroed = had and gone

    # -- hooks and wrappers --------------------------------------------------------------------
    def on_forward(self, module: nn.Module, args: tuple) -> None:
        if not torch.is_grad_enabled():
            return  # evaluation passes (e.g. under no_grad) are not training steps
        device_type = self.device_type
        self.count["forward"] += 1
        if not torch.is_autocast_enabled(device_type):
            self.count["forward_no_autocast"] += 1
            if any(torch.is_autocast_enabled(t) for t in AUTOCAST_DEVICE_TYPES
                   if t != device_type):
                self.count["forward_other_device"] += 1
        elif torch.get_autocast_dtype(device_type) != self.scenario.amp_dtype:
            self.count["forward_wrong_dtype"] += 1
            self.wrong_dtypes.add(torch.get_autocast_dtype(device_type))

    def backward(self, original: Callable, tensors, *args, **kwargs):
        if self.count["backward"]:
            self.close_iteration(complete=True)
        self.count["backward"] += 1
        if torch.is_autocast_enabled(self.device_type):
            self.count["backward_in_autocast"] += 1
        root = tensors[0] if isinstance(tensors, (tuple, list)) else tensors
        scaled = self.scaled_output is not None and root is self.scaled_output
        if not scaled:
            self.count["backward_unscaled"] += 1
        self.scaled_output = None
        if any(p.grad is not None and bool(p.grad.count_nonzero()) for p in self.params):
            self.count["backward_not_zeroed"] += 1
        result = original(tensors, *args, **kwargs)
        self.after_backward = [None if p.grad is None else p.grad.detach().clone()
                               for p in self.params]
        self.pre_clip = None if scaled else self.after_backward
        self.unscaled, self.scaled_backward = False, scaled
        return result

    def scale(self, original: Callable, scaler: torch.amp.GradScaler, outputs):
        result = original(scaler, outputs)
        if scaler.is_enabled():
            self.count["scale_enabled"] += 1
            self.scaled_output = result
            if not any(seen is scaler for seen in self.scalers):
                self.scalers.append(scaler)
        else:
            self.count["scale_disabled"] += 1
        return result

    def _check_unmodified_before_unscale(self, scaler: torch.amp.GradScaler) -> None:
        if not scaler.is_enabled() or self.unscaled or self.after_backward is None:
            return
        self.unscaled = True
        if self.iteration.zeroed:
            return  # zeroed, not clipped: named as such
        for p, before in zip(self.params, self.after_backward, strict=True):
            if (p.grad is None) != (before is None) or (
                    before is not None and not _same_values(p.grad, before)):
                self.count["modified_before_unscale"] += 1
                return

    def unscale_(self, original: Callable, scaler: torch.amp.GradScaler, optimizer):
        self.count["unscale"] += scaler.is_enabled()
        self.note_zeroed()
        self._check_unmodified_before_unscale(scaler)
        result = original(scaler, optimizer)
        if scaler.is_enabled() and self.pre_clip is None:
            self.pre_clip = [None if p.grad is None else p.grad.detach().clone()
                             for p in self.params]
        return result

    def step(self, original: Callable, scaler: torch.amp.GradScaler, optimizer, *args, **kwargs):
        self.iteration.steps += 1
        self.iteration.scaler_step_calls += 1
        self.iteration.calls.append("scaler.step(optimizer)")
        self.note_zeroed()
        self._check_unmodified_before_unscale(scaler)
        self.in_scaler_step = True
        try:
            result = original(scaler, optimizer, *args, **kwargs)
        finally:
            self.in_scaler_step = False
        self.count["scaler_step"] += scaler.is_enabled()  # counted only when it succeeded
        self.iteration.scaler_steps_done += scaler.is_enabled()
        return result

    def update(self, original: Callable, scaler: torch.amp.GradScaler, *args, **kwargs):
        self.count["update"] += scaler.is_enabled()
        self.iteration.updates += scaler.is_enabled()
        if scaler.is_enabled():
            self.iteration.calls.append("scaler.update()")
        return original(scaler, *args, **kwargs)

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.count["optimizer_step"] += 1
        if not self.in_scaler_step and self.scaled_backward and self.scalers:
            # a direct step with no unscale_ since backward: were the scaled gradients clipped?
            self._check_unmodified_before_unscale(self.scalers[-1])
        if not self.in_scaler_step:
            self.iteration.steps += 1
            self.iteration.calls.append("optimizer.step()")
        self.note_zeroed()
        limit = self.scenario.max_grad_norm
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads or self.iteration.zeroed or self.iteration.steps > 1:
            return  # a second step in one iteration is named as such
        norm = _norm(grads)
        if limit is not None and norm > limit * 1.001:
            self.count["not_clipped"] += 1
        before = _norm([g for g in self.pre_clip or [] if g is not None])
        if before == 0 or not math.isfinite(before):
            return  # not known (still scaled, or an overflow the scaler skips)
        if limit is None and norm < before * (1 - CLIP_RTOL):
            self.count["clipped_without_limit"] += 1
            self.clipped_to = norm
        elif limit is not None and norm < min(before, limit) * (1 - CLIP_RTOL):
            self.count["over_clipped"] += 1
            self.clipped_to = norm
        elif limit is not None and norm > before * (1 + CLIP_RTOL):
            self.count["clipped_up"] += 1  # g * max_norm / norm without min(1, ...)
            self.clipped_to, self.clipped_from = norm, before

    def install(self, stack: ExitStack) -> None:
        """Register the hooks and wrap the GradScaler methods and autograd's backward."""
        stack.callback(self.model.register_forward_pre_hook(self.on_forward).remove)
        stack.callback(self.optimizer.register_step_pre_hook(self.on_optimizer_step).remove)
        backward = torch.autograd.backward
        stack.enter_context(mock.patch.object(
            torch.autograd, "backward", lambda *a, **k: self.backward(backward, *a, **k)))
        for name in ("scale", "unscale_", "step", "update"):
            original = getattr(torch.amp.GradScaler, name)
            spy = getattr(self, name)

            def wrapper(scaler, *args, _original=original, _spy=spy, **kwargs):
                return _spy(_original, scaler, *args, **kwargs)

            stack.enter_context(mock.patch.object(torch.amp.GradScaler, name, wrapper))


def shared_problems(spy: TrainingSpy, max_grad_norm: float | None) -> list[Problem]:
    """The mistakes every training checker names with the same rule and the same words (one
    verdict everywhere): backward inside autocast, a clip that makes small gradients larger, and
    a forward pass under another device type's autocast."""
    c, found = spy.count, []
    if c["backward_in_autocast"]:
        found.append(Problem.named(
            BACKWARD_IN_AUTOCAST, f"backward() was called inside the autocast block "
            f"({c['backward_in_autocast']} of {c['backward']} backward calls).", "Only the "
            "forward pass and the loss belong there (torch.autocast's documentation: \"Backward "
            "passes under autocast are not recommended\"); autograd already runs each op's "
            "backward in the dtype its forward used.", "dedent the backward call out of the "
            "`with torch.autocast(...):` block."))
    if c["clipped_up"]:
        found.append(Problem.named(
            CLIPPED_UP, f"max_grad_norm={max_grad_norm} was given and the gradient's norm was "
            f"only {spy.clipped_from:.3g}, yet the optimizer stepped with a norm of "
            f"{spy.clipped_to:.3g} ({c['clipped_up']} steps): the clip made a small gradient "
            "larger.", "Clipping only ever shrinks: the factor is min(1, max_norm / norm). "
            "Multiplying by max_norm / norm alone sets every gradient's norm to max_norm, so "
            "each step is as long as the largest allowed, however small the gradient.",
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm), or by hand a "
            "factor of min(1.0, max_grad_norm / (norm + 1e-6))."))
    return found


# -- other devices -----------------------------------------------------------------------------
# The checkers train on the CPU; whether the code follows the device it is given is seen on fake
# tensors of these device types (FakeTensorMode: shapes, dtypes and devices, no values), up to the
# first forward pass: autograd cannot run backward on fake tensors without the device.
SIMULATED_DEVICE_TYPES = ("cuda", "xpu", "mps")


def simulated_name(device_type: str) -> str:
    """The name of a run on fake ``device_type`` tensors, for the report."""
    return f"simulated {device_type} (float16)"


class FirstForward(Exception):  # noqa: N818 - a signal, not an error
    """Raised at the first training forward pass of a simulated run: all it needs is seen."""


@dataclass
class ForwardSeen:
    """The autocast state at the first training forward pass on a simulated device."""

    device_type: str
    enabled: bool | None = None  # None: no forward pass ran
    dtype: torch.dtype | None = None
    others: tuple[str, ...] = ()  # the other device types whose autocast was on


@contextmanager
def simulated_device(device_type: str, model: nn.Module) -> Iterator[ForwardSeen]:
    """Fake tensors of ``device_type`` (make the inputs inside), torch.autocast and GradScaler
    taking the device type as if it were here, and ``model`` stopped at its first training forward
    pass (:class:`FirstForward`) with the autocast state noted. Everything is restored after."""
    seen = ForwardSeen(device_type)

    def hook(module: nn.Module, args: tuple) -> None:
        if not torch.is_grad_enabled():
            return
        seen.enabled = torch.is_autocast_enabled(device_type)
        seen.dtype = torch.get_autocast_dtype(device_type)
        seen.others = tuple(t for t in AUTOCAST_DEVICE_TYPES
                            if t != device_type and torch.is_autocast_enabled(t))
        raise FirstForward

    with ExitStack() as stack:
        # torch.autocast("cuda") and GradScaler("cuda") switch themselves off without CUDA; both
        # look the test up as torch.cuda.amp.common.amp_definitely_not_available (torch/amp's
        # autocast_mode.py and grad_scaler.py, 2.9 to 2.14), so it is patched there, not deprecated
        stack.enter_context(mock.patch.object(torch.cuda.amp.common,
                                              "amp_definitely_not_available", lambda: False))
        stack.enter_context(mock.patch.object(torch.cuda, "is_bf16_supported",
                                              lambda including_emulation=True: True))
        stack.enter_context(left_behind("the simulated run"))  # restores autocast's state
        stack.callback(model.register_forward_pre_hook(hook).remove)
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(fake_tensors())
        yield seen


def simulated_problems(seen: ForwardSeen, amp_dtype: torch.dtype) -> list[Problem]:
    """What the first forward pass on a simulated device shows: autocast for the wrong device
    type, or a dtype chosen by the device instead of the one asked for. Nothing if no forward ran
    or no autocast was on at all (the CPU runs name those)."""
    device_type = seen.device_type
    if seen.enabled is None or not (seen.enabled or seen.others):
        return []  # no forward, or no autocast at all: the CPU runs name it
    if not seen.enabled:
        other = f"while the autocast of {', '.join(map(repr, seen.others))} was on"
        return [Problem.named(
            AUTOCAST_OTHER_DEVICE, f"On a simulated {device_type!r} device the forward pass ran "
            f"without the {device_type!r} autocast, {other}.", "Autocast keeps one switch per "
            "device type and changes only ops on tensors of that type: a device type written "
            "into the code (\"cpu\", or a choice between \"cuda\" and \"cpu\") leaves the "
            "model on any other device (an Intel XPU, an Apple GPU) in float32.", "take the "
            "device type from what you are given: the device_type argument, or "
            "inputs.device.type.")]
    if seen.dtype != amp_dtype:
        return [Problem.named(
            DTYPE_BY_DEVICE, f"On a simulated {device_type!r} device autocast ran in "
            f"{seen.dtype}, not the {amp_dtype} asked for.", "The dtype was chosen from the "
            "device type instead of taken from the caller, who picked it for this device (a "
            "float16 GPU without native bfloat16, say).", "pass the dtype you were given: "
            "`torch.autocast(device_type=..., dtype=amp_dtype)` (fp16_step: always float16).")]
    return []


# A mistake on a simulated device that the CPU runs explain already (no autocast, or a wrong
# dtype, everywhere) is not named again.
_EXPLAINED_BY = {AUTOCAST_OTHER_DEVICE: {FORWARD_NOT_AUTOCAST},
                 DTYPE_BY_DEVICE: {FORWARD_NOT_AUTOCAST, WRONG_AUTOCAST_DTYPE}}


def check_on_devices(exercise: Exercise, scenarios: Iterable[S],
                     problems_of: Callable[[S], list[Problem]],
                     simulated_of: Callable[[str], list[Problem]],
                     differences: set[str] | frozenset[str] = frozenset(),
                     right_result: Callable[[], bool] | None = None,
                     result_keys: set[str] | frozenset[str] = frozenset()) -> CheckResult:
    """A training checker's whole run: its CPU ``scenarios`` (stopping after one that ran past
    the time limit), then each of :data:`SIMULATED_DEVICE_TYPES` through ``simulated_of``,
    reported and recorded as one result. ``differences``: the keys that say only that a result
    differs from the reference's; where a named mistake was found in any run, it explains them,
    and they are left out. ``right_result``: whether every scenario's result matched the
    reference's; then the ``result_keys`` (diagnoses of a result: a gradient, a clip, a count)
    are left out too, and only the rules the lesson states in words can reject the answer."""
    found = []
    for scenario in scenarios:
        found.append((scenario.name, problems_of(scenario)))
        if stops(found[-1][1]):
            return exercise.report(found)
    if right_result is not None and right_result():
        found = [(name, [p for p in problems if p.key not in result_keys])
                 for name, problems in found]
    named = {p.key for _, problems in found for p in problems}
    if named - set(differences):
        found = [(name, [p for p in problems if p.key not in differences])
                 for name, problems in found]
    for device_type in SIMULATED_DEVICE_TYPES:
        found.append((simulated_name(device_type),
                      [p for p in simulated_of(device_type)
                       if not named & _EXPLAINED_BY.get(p.key, set())]))
    return exercise.report(found)


def check_against_reference(exercise: Exercise, scenarios: Iterable[S],
                            judged_of: Callable[[S], tuple[list[Problem], bool]],
                            simulated_of: Callable[[str], list[Problem]],
                            differences: set[str] | frozenset[str],
                            result_keys: set[str] | frozenset[str]) -> CheckResult:
    """:func:`check_on_devices` for a checker that runs the reference answer beside the
    learner's: ``judged_of(scenario)`` gives the scenario's problems and whether its result
    matched the reference's; where every one did, the ``result_keys`` are left out."""
    matched: list[bool] = []

    def problems_of(scenario: S) -> list[Problem]:
        problems, right = judged_of(scenario)
        matched.append(right)
        return problems

    return check_on_devices(exercise, scenarios, problems_of, simulated_of,
                            differences=differences,
                            right_result=lambda: bool(matched) and all(matched),
                            result_keys=result_keys)
