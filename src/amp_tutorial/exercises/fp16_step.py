"""The ``fp16_step`` exercise (lesson 02): one float16 optimizer step with gradient clipping, and a
checker that names mistakes.

``check_fp16_step(fn)`` calls the learner's step a few times on a tiny MLP on the CPU (float16
autocast, ``torch.amp.GradScaler("cpu")``), with SGD and with Adam, beside the reference answer
(``exercises.solutions.fp16_step``) on the same batches, while a ``TrainingSpy``
(``exercises.training_spy``) watches what it does; the parameters are also compared with the same
steps in plain fp32, clipping included. One run starts the scale so high that the first step
overflows: a correct step is skipped (the parameters stay) and the scale backs off. The number of
steps and the batch sizes (which differ between steps, one batch short) are drawn from a seeded
generator (:func:`draw_scenarios`), so an answer written for one shape of batch fails.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import random
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn

from amp_tutorial.exercises import checking
from amp_tutorial.exercises.checking import (
    Attempt,
    CheckResult,
    Exercise,
    Problem,
    attempt,
    error_problem,
    left_behind,
    type_problem,
)
from amp_tutorial.exercises.solutions.fp16_step import fp16_step as reference_answer
from amp_tutorial.exercises.train_loop import BATCH_SIZE, make_exercise_problem
from amp_tutorial.exercises.training_spy import (
    CLIP_BEFORE_UNSCALE,
    FORWARD_NOT_AUTOCAST,
    GRADS_NOT_ZEROED,
    GRADS_ZEROED_BEFORE_STEP,
    LOSS_NOT_SCALED,
    NO_SCALER_UPDATE,
    NOT_CLIPPED,
    OPTIMIZER_STEP_DIRECT,
    STEPPED_TWICE,
    WRONG_AUTOCAST_DTYPE,
    TrainingSpy,
    check_against_reference,
    shared_problems,
    simulated_device,
    simulated_problems,
)

# The problem every check runs: small enough to answer in well under a second on a laptop CPU.
N_STEPS = 3
MAX_NORM = 0.1  # below the problem's gradient norm (about 0.27 at the first step): the clip fires
LOOSE_NORM = 1.0  # above it: a right clip leaves the gradients alone; one without min(1, .)
# scales them up
INIT_SCALE = 2.0**12  # this problem's first step overflows in float16 from a scale of 2**19 up
OVERFLOW_SCALE = 2.0**24  # 32 times that: a correct first step must be skipped
# Measured over 10 seeds (torch 2.14.1, CPU): a correct float16 step's loss is within 0.1% of
# fp32's; after 3 steps the parameters' change differs from fp32's by at most 2% with SGD and
# 15% with Adam (its first steps are about lr * sign(gradient), so a gradient that rounds across 0
# flips a whole step). Clipping the L1 norm instead of the L2 norm differs by 92% with SGD.
LOSS_RTOL = 0.01
PARAMS_RTOL = {"SGD": 0.1, "Adam": 0.3}
DEVICE_TYPE = "cpu"  # float16 autocast and GradScaler("cpu") both work on the CPU
REFERENCE_RTOL = 1e-4  # the reference answer run beside the learner's on the same steps.
# Measured on the drawn scenarios (torch 2.14.1, 2-core Zen 3): the course's right answers and a
# mean written by hand are bit-identical to it (0), a clip written by hand with its own 1e-6
# epsilon 4e-8; targets rounded to float16 differ by 2e-5 to 2e-3 (caught in 3 of 4 scenarios),
# a loss divided by a hard-coded 64 by 0.6 to 1.0
SEED = 2  # the scenarios' draw (lesson 02)
STEPS = (2, 5)  # steps per scenario, drawn in this range (the overflowing one takes 1)
SIZES = range(40, 129, 8)  # batch sizes, a different one per step
SHORT = range(8, 33, 8)  # the one short batch per scenario

# Problem keys: one per mistake the checker can name.
CLIP_WITHOUT_UNSCALE = "clip-without-unscale"
UNSCALED_TWICE = "unscaled-twice"
OTHER_SCALER = "other-scaler"
UPDATE_BEFORE_STEP = "update-before-step"
RETURNED_SCALED_LOSS = "returned-scaled-loss"
LOSS_NOT_LIKE_FP32 = "loss-not-like-fp32"
PARAMS_NOT_LIKE_FP32 = "params-not-like-fp32"
OVERFLOW_NOT_HANDLED = "overflow-not-handled"
NOT_LIKE_REFERENCE = "not-like-reference"
__all__ = ["check_fp16_step", "make_step_problem"]
PRAISE = ("All checks passed: autocast, the scaled backward, unscale_ before clipping, the "
          "scaler's step and update, and the returned loss are right (SGD and Adam), and an "
          "overflowing step is skipped.")
EXERCISE = Exercise("02", "fp16_step", PRAISE, loops=(
    "any loop: one step is one forward, one scaled backward, one scaler.step and one "
    "scaler.update, with no loop; a `while` that waits for the scale to settle does not end"))

StepFn = Callable[..., object]
OPTIMIZERS = {"SGD": (torch.optim.SGD, 0.1), "Adam": (torch.optim.Adam, 1e-2)}  # class, lr


@dataclass(frozen=True)
class Scenario:
    """One run: ``steps`` calls of the learner's step with one optimizer and one initial scale."""

    name: str
    optimizer: str  # a key of OPTIMIZERS
    init_scale: float
    steps: int
    amp_dtype: torch.dtype = torch.float16  # what the TrainingSpy expects
    max_grad_norm: float | None = MAX_NORM

    @property
    def overflows(self) -> bool:
        return self.init_scale >= OVERFLOW_SCALE


    sizes: tuple[int, ...] = (BATCH_SIZE,) * N_STEPS  # one batch size per step

    def problem(self) -> tuple[nn.Module, Batches]:
        return make_step_problem(sizes=self.sizes)


# What each scenario is for: SGD, Adam, a clip that must not fire, an overflowing first step.
KINDS = (
    Scenario("SGD", "SGD", INIT_SCALE, N_STEPS),
    Scenario("Adam", "Adam", INIT_SCALE, N_STEPS),
    Scenario("max_norm above the gradient norm", "SGD", INIT_SCALE, N_STEPS,
             max_grad_norm=LOOSE_NORM),
    Scenario("first step overflows", "SGD", OVERFLOW_SCALE, 1),
)


def draw_scenarios(seed: int = SEED) -> tuple[Scenario, ...]:
    """:data:`KINDS` with drawn shapes: the steps in :data:`STEPS` (the overflowing scenario
    keeps its one step), a different batch size from :data:`SIZES` per step, and one of them, at
    a drawn position, short (:data:`SHORT`)."""
    rng, drawn = random.Random(seed), []
    for kind in KINDS:
        steps = 1 if kind.overflows else rng.randint(*STEPS)
        sizes = rng.sample(SIZES, steps)
        sizes[rng.randrange(steps)] = rng.choice(SHORT)
        name = f"{kind.name} (batches of {', '.join(map(str, sizes))})"
        drawn.append(dataclasses.replace(kind, name=name, steps=steps, sizes=tuple(sizes)))
    return tuple(drawn)


SCENARIOS = draw_scenarios()
Batches = list[tuple[torch.Tensor, torch.Tensor]]


def make_step_problem(seed: int = 0, sizes: tuple[int, ...] = (BATCH_SIZE,) * N_STEPS
                      ) -> tuple[nn.Module, Batches]:
    """Lesson 06's small MLP and smooth regression on the CPU, one batch of each size in
    ``sizes`` (the default, ``N_STEPS`` batches of 64, is lesson 06's problem itself)."""
    model, _ = make_exercise_problem(seed, 0)
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(8, 1, generator=generator)
    inputs = [torch.randn(size, 8, generator=generator) for size in sizes]
    return model, [(x, torch.sin(x @ direction)) for x in inputs]


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _optimizer(scenario: Scenario, model: nn.Module) -> torch.optim.Optimizer:
    optimizer_class, lr = OPTIMIZERS[scenario.optimizer]
    return optimizer_class(model.parameters(), lr=lr)


@functools.cache
def _reference(scenario: Scenario) -> tuple[tuple[float, ...], torch.Tensor, float]:
    """The losses, final parameters and scale of the reference answer's steps."""
    model, data = scenario.problem()
    optimizer = _optimizer(scenario, model)
    scaler = torch.amp.GradScaler(DEVICE_TYPE, init_scale=scenario.init_scale)
    losses = tuple(reference_answer(model, optimizer, scaler, inputs, targets, nn.MSELoss(),
                                    scenario.max_grad_norm)
                   for inputs, targets in data[:scenario.steps])
    return losses, _params(model), scaler.get_scale()


def reference_difference(outcome: _Outcome, scenario: Scenario) -> float:
    """The largest relative difference of the learner's losses, parameters and scale from the
    reference answer's on the same steps (inf where they cannot be compared)."""
    losses, params, scale = _reference(scenario)
    try:
        values = [float(v.detach()) if isinstance(v := run.value, torch.Tensor) else float(v)
                  for run in outcome.runs]
    except (TypeError, ValueError):
        return math.inf
    if len(values) != len(losses) or not all(map(math.isfinite, values)):
        return math.inf
    worst = max(abs(v - r) / abs(r) for v, r in zip(values, losses, strict=True))
    moved = ((outcome.params - params).norm() / (params - outcome.initial).norm()).item() if (
        not torch.equal(params, outcome.initial)) else float(
            not torch.equal(outcome.params, params))
    rel = max(worst, moved, abs(outcome.scaler.get_scale() - scale) / scale)
    return rel if math.isfinite(rel) else math.inf


@functools.cache
def _fp32_reference(scenario: Scenario) -> tuple[tuple[float, ...], torch.Tensor]:
    """The losses and final parameters of the same steps in plain fp32, clipping included (an
    overflowing step is skipped, so its parameters are the initial ones)."""
    model, data = scenario.problem()
    optimizer, losses = _optimizer(scenario, model), []
    for inputs, targets in data[:scenario.steps]:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), scenario.max_grad_norm)
        if not scenario.overflows:
            optimizer.step()
        losses.append(loss.item())
    return tuple(losses), _params(model)


class _StepSpy(TrainingSpy):
    """The course's training spy, plus what one step's rules need: the learner's own ``unscale_``
    calls per call of the step, and whether gradients changed before any of them (then only
    ``scaler.step`` unscaled them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.count.update(unscaled_twice=0, modified_before_step_unscaled=0,
                          update_before_step=0)
        self.own_unscales = 0

    def new_call(self) -> None:
        self.own_unscales = 0

    def close_iteration(self, complete: bool) -> None:
        calls = self.iteration.calls
        if ("scaler.update()" in calls and "scaler.step(optimizer)" in calls
                and calls.index("scaler.update()") < calls.index("scaler.step(optimizer)")):
            self.count["update_before_step"] += 1
        super().close_iteration(complete)

    def unscale_(self, original: Callable, scaler: torch.amp.GradScaler, optimizer):
        if scaler.is_enabled() and not self.in_scaler_step:  # the learner's call, not step()'s
            self.own_unscales += 1
            self.count["unscaled_twice"] += self.own_unscales == 2
        return super().unscale_(original, scaler, optimizer)

    def step(self, original: Callable, scaler: torch.amp.GradScaler, optimizer, *args, **kwargs):
        before = self.count["modified_before_unscale"]  # counted here: no unscale_ came first
        try:
            return super().step(original, scaler, optimizer, *args, **kwargs)
        finally:
            self.count["modified_before_step_unscaled"] += (
                self.count["modified_before_unscale"] - before)


@dataclass
class _Outcome:
    """What one scenario's calls did: the spy, each call, and the scaler they were given."""

    spy: _StepSpy
    runs: list[Attempt]
    scaler: torch.amp.GradScaler
    params: torch.Tensor
    initial: torch.Tensor
    left: list[Problem]  # what the calls left behind (checking.left_behind)


def _run(fn: StepFn, scenario: Scenario) -> _Outcome:
    model, data = scenario.problem()
    initial = _params(model)
    optimizer = _optimizer(scenario, model)
    scaler = torch.amp.GradScaler(DEVICE_TYPE, init_scale=scenario.init_scale)
    spy = _StepSpy(model, optimizer, scenario, DEVICE_TYPE)
    runs, left = [], []
    with ExitStack() as stack:
        spy.install(stack)
        for inputs, targets in data[:scenario.steps]:
            spy.new_call()
            with left_behind("fp16_step", models={"model": model},
                             tensors={"inputs": inputs, "targets": targets}) as state:
                runs.append(attempt(fn, model, optimizer, scaler, inputs, targets, nn.MSELoss(),
                                    scenario.max_grad_norm))
            left += [p for p in state if p.key not in {q.key for q in left}]
            spy.close_iteration(complete=runs[-1].error is None)  # one call, one iteration
            if runs[-1].error is not None:
                break
    return _Outcome(spy, runs, scaler, _params(model), initial, left)


def _step_problems(outcome: _Outcome, scenario: Scenario) -> list[Problem]:
    """Mistakes in how the step is done, from what the spy counted."""
    spy, c = outcome.spy, outcome.spy.count
    found = []
    if c["forward_no_autocast"]:
        found.append(Problem.named(FORWARD_NOT_AUTOCAST,
            f"The forward pass ran without autocast ({c['forward_no_autocast']} of "
            f"{c['forward']} forward passes), so it computed in float32.",
            "Without autocast nothing runs in float16 and the GradScaler has nothing to protect.",
            "put model(inputs) and the loss inside `with torch.autocast(device_type="
            "inputs.device.type, dtype=torch.float16):`."))
    if c["forward_wrong_dtype"]:
        got = ", ".join(str(d) for d in spy.wrong_dtypes)
        found.append(Problem.named(WRONG_AUTOCAST_DTYPE,
            f"autocast ran in {got}, not torch.float16.",
            "Without dtype=, torch.autocast uses the device type's default: torch.bfloat16 for "
            "\"cpu\", torch.float16 for \"cuda\", so the same code would be a "
            "bfloat16 step on a CPU.", "pass dtype=torch.float16."))
    found += shared_problems(spy, scenario.max_grad_norm)
    if c["backward_unscaled"]:
        found.append(Problem.named(LOSS_NOT_SCALED,
            "The loss was not scaled before backward: backward() ran on the unscaled loss.",
            "Small float16 gradients flush to zero, and the scaler then divides the gradients "
            "by a scale they were never multiplied by (if scaler.scale was never called, "
            "unscale_ raises \"Attempted unscale_ but _scale is None.\").",
            "call scaler.scale(loss).backward()."))
    if c["backward_not_zeroed"]:
        found.append(Problem.named(GRADS_NOT_ZEROED,
            f"Gradients were not zeroed between steps ({c['backward_not_zeroed']} backward "
            "calls added to the previous step's gradients).",
            "Each step must use the gradients of its own batch only.",
            "call optimizer.zero_grad() at the start of the step, before backward "
            "(set_to_none=True or False, both reset them)."))
    if c["zeroed_before_step"]:
        found.append(Problem.named(GRADS_ZEROED_BEFORE_STEP,
            "The gradients were zeroed after backward() and before the optimizer step, so the "
            "step had no gradients to use.",
            "With zero_grad(set_to_none=True) the gradients are None, scaler.step finds nothing "
            "to unscale and raises (\"No inf checks were recorded for this optimizer.\"); with "
            "set_to_none=False it raises nothing and steps on all-zero gradients, silently (SGD "
            "does not move, Adam still moves by the momentum of earlier steps).",
            "zero them at the start of the step, before the forward pass; never between "
            "backward and step."))
    scaled_clip = c["modified_before_step_unscaled"]
    if c["modified_before_unscale"] > scaled_clip:
        found.append(Problem.named(CLIP_BEFORE_UNSCALE,
            "The gradients were changed (clipped?) between backward and scaler.unscale_.",
            "They were still multiplied by the scale, so clip_grad_norm_ measured and clipped "
            "the scaled norm (max_norm acted like max_norm / scale on the true gradients).",
            "call scaler.unscale_(optimizer) first, then clip, then scaler.step(optimizer)."))
    if scaled_clip:
        found.append(Problem.named(CLIP_WITHOUT_UNSCALE,
            "The gradients were changed (clipped?) and scaler.unscale_(optimizer) was never "
            "called: scaler.step unscaled them only afterwards.",
            "clip_grad_norm_ measured the scaled norm, scale times the true one (the scale is "
            f"{_power(scenario.init_scale)} in this check), so max_norm acted like "
            "max_norm / scale and the clip fired on nearly every step: SGD's steps come out up "
            "to scale times too small, and Adam gets gradients of one fixed norm.",
            "call scaler.unscale_(optimizer) after backward, then clip, then "
            "scaler.step(optimizer) (it knows the gradients are unscaled already)."))
    if c["unscaled_twice"]:
        found.append(Problem.named(UNSCALED_TWICE,
            "scaler.unscale_(optimizer) was called twice in one step.",
            "It divides the gradients by the scale in place, so a second call would divide "
            "them again; GradScaler refuses it: \"unscale_() has already been called on this "
            "optimizer since the last update().\"",
            "call it once, after backward and before clipping; scaler.step does not call it "
            "again when you have."))
    if c["not_clipped"]:
        found.append(Problem.named(NOT_CLIPPED,
            f"The gradients were not clipped: max_norm={scenario.max_grad_norm} was given, but "
            f"{c['not_clipped']} of the optimizer steps saw a larger gradient norm.",
            "The clip is there to cap the update when a gradient spikes.",
            "clip with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) after "
            "scaler.unscale_(optimizer) and before scaler.step(optimizer)."))
    if c["optimizer_step_direct"]:
        found.append(Problem.named(OPTIMIZER_STEP_DIRECT,
            "optimizer.step() was called directly instead of scaler.step(optimizer).",
            "scaler.step unscales the gradients if you have not, and skips the step when they "
            "contain inf/NaN; a direct call applies scaled or overflowed gradients.",
            "call scaler.step(optimizer)."))
    if c["stepped_twice"]:
        found.append(Problem.named(STEPPED_TWICE,
            f"The optimizer was stepped more than once in one step (your code called: "
            f"{', '.join(spy.twice_calls)}).",
            "Each batch gets one update, and scaler.step(optimizer) calls optimizer.step() for "
            "you (unless it skips the step).",
            "call scaler.step(optimizer) once and not optimizer.step() as well, then "
            "scaler.update()."))
    if c["iterations_without_update"]:
        found.append(Problem.named(NO_SCALER_UPDATE,
            "scaler.update() is missing: scaler.step(optimizer) ran without scaler.update() "
            "after it.",
            "update() backs the scale off after an overflow, grows it after good steps, and "
            "resets the scaler for the next step; without it the next step's unscale_ raises "
            "(\"unscale_() is being called after step().\").",
            "call scaler.update() once after every scaler.step(optimizer)."))
    if c["update_before_step"]:
        found.append(Problem.named(UPDATE_BEFORE_STEP,
            "scaler.update() ran before scaler.step(optimizer) in the same step.",
            "update() reads what step() found (inf/NaN in the gradients) to set the next scale, "
            "and resets the scaler for the next step; run before step(), it resets too early, "
            "and the step() after it leaves the scaler marked as stepped, so the next call's "
            "unscale_ raises \"unscale_() is being called after step()\" (torch's way of "
            "saying update() did not come after step()).",
            "scaler.scale(loss).backward(), scaler.unscale_(optimizer), clip, "
            "scaler.step(optimizer), then scaler.update(), in that order, as the lesson does."))
    if any(scaler is not outcome.scaler for scaler in spy.scalers):
        found.append(Problem.named(OTHER_SCALER,
            "The loss was scaled by a GradScaler other than the one passed in.",
            "The scaler's state (the current scale and its count of good steps) must carry "
            "over from step to step: a new scaler starts again at its init_scale and never "
            "learns the scale, so it cannot back off for good after an overflow.",
            "use the scaler argument; do not create one inside the step."))
    return found


def _power(scale: float) -> str:
    """A scale as the course writes it: 2^24 for a power of two."""
    exponent = math.log2(scale) if scale > 0 else 0.5
    return f"2^{exponent:.0f}" if exponent.is_integer() else f"{scale:g}"


def _scaled(ratio: float) -> list[Problem]:
    return [Problem.named(RETURNED_SCALED_LOSS,
        f"The returned loss is about {ratio:.3g} times the fp32 loss: that is the scaled loss.",
        "The scale is a factor GradScaler picked, not part of the loss.",
        "return loss.item(), not scaler.scale(loss).item().")]


def _result_problems(outcome: _Outcome, scenario: Scenario, other_problems: bool
                     ) -> list[Problem]:
    """Mistakes in what the step returned and left behind, against the same steps in fp32."""
    values = [run.value for run in outcome.runs]
    for value in values:
        if wrong := type_problem(value, numbers.Real, "fp16_step", "a float (the loss)",
                                 "return loss.item(), the loss of this step as a Python float."):
            return [wrong]
    ref_losses, ref_params = _fp32_reference(scenario)
    ratios = [float(v) / r for v, r in zip(values, ref_losses, strict=False)]
    if ratios[0] > 100:  # the first call's loss is the same whatever the update did
        return _scaled(ratios[0])
    if other_problems:  # other mistakes explain a mismatch already
        return []
    if any(r > 100 for r in ratios):
        return _scaled(max(ratios))
    moved = [] if scenario.overflows else _params_problems(outcome, scenario, ref_params)
    # the first loss comes before any update: off there, the loss is wrong; off only in later
    # steps while the parameters moved differently, the update is (the losses follow it)
    if not all(abs(r - 1) <= LOSS_RTOL for r in ratios) and (  # NaN fails too
            not abs(ratios[0] - 1) <= LOSS_RTOL or not moved):
        pairs = ", ".join(f"{float(v):.4g} vs {r:.4g}" for v, r in zip(values, ref_losses,
                                                                        strict=False))
        return [Problem.named(LOSS_NOT_LIKE_FP32,
            f"The returned losses do not match the fp32 losses of the same steps (yours vs "
            f"fp32: {pairs}).", "The step should return the loss its forward pass computed, "
            "before the update.", "return loss.item() of the loss that you scale and "
            "backpropagate.")]
    if scenario.overflows:
        return _overflow_problems(outcome, scenario)
    return moved


def _params_problems(outcome: _Outcome, scenario: Scenario, ref_params: torch.Tensor
                     ) -> list[Problem]:
    """The parameters' change after the scenario's steps against fp32's."""
    change, ref_change = outcome.params - outcome.initial, ref_params - outcome.initial
    rel = ((change - ref_change).norm() / ref_change.norm()).item()
    tolerance = PARAMS_RTOL[scenario.optimizer]
    if not rel <= tolerance:  # NaN fails too
        return [Problem.named(PARAMS_NOT_LIKE_FP32,
            f"After {scenario.steps} steps with {scenario.optimizer} the parameters moved "
            f"differently from the same steps in fp32 (they differ by {rel:.0%} of fp32's "
            f"change; correct float16 steps stay within {tolerance:.0%}).",
            "Something changes the gradients or the update beyond float16 rounding.",
            "clip with clip_grad_norm_(model.parameters(), max_norm) (the default L2 norm) "
            "after scaler.unscale_(optimizer), and change nothing else.")]
    return []


def _overflow_problems(outcome: _Outcome, scenario: Scenario) -> list[Problem]:
    """The first step overflowed: it must be skipped, and the scale must back off."""
    moved = not torch.equal(outcome.params, outcome.initial)
    expected = scenario.init_scale * outcome.scaler.get_backoff_factor()
    scale = outcome.scaler.get_scale()
    if not moved and scale == expected:
        return []
    what = []
    if moved:
        what.append("the parameters changed (the step should have been skipped)")
    if scale != expected:
        what.append(f"the scale went from {_power(scenario.init_scale)} to {_power(scale)}, "
                    f"not {_power(expected)}")
    return [Problem.named(OVERFLOW_NOT_HANDLED,
        f"This step's scaled gradients overflowed float16 (the scale starts at "
        f"{_power(scenario.init_scale)}), but {' and '.join(what)}.",
        "scaler.step(optimizer) skips a step whose gradients hold inf or NaN, and "
        "scaler.update() then multiplies the scale by backoff_factor (0.5); both must run "
        "on every step, skipped or not.",
        "call scaler.step(optimizer) and then scaler.update() unconditionally, with no "
        "argument to update().")]


@EXERCISE.checker
def check_fp16_step(fn: StepFn) -> CheckResult:
    """Call ``fn`` for a few steps on a small CPU problem (SGD, Adam, an overflowing first step)
    and name every mistake.

    ``fn(model, optimizer, scaler, inputs, targets, loss_fn, max_norm)`` must do one float16
    training step with clipping and return the loss as a float. Takes well under a second.
    """
    return check_against_reference(EXERCISE, SCENARIOS,
                                   lambda scenario: _scenario_problems(fn, scenario),
                                   lambda device_type: _simulated(fn, device_type),
                                   {NOT_LIKE_REFERENCE}, RESULT_KEYS)


def _simulated(fn: StepFn, device_type: str) -> list[Problem]:
    """The step called with fake ``device_type`` inputs, up to its forward pass: does its
    autocast follow the inputs' device?"""
    model, data = make_step_problem()
    optimizer = torch.optim.SGD(model.parameters(), lr=OPTIMIZERS["SGD"][1])
    scaler = torch.amp.GradScaler(DEVICE_TYPE, init_scale=INIT_SCALE)
    with simulated_device(device_type, model) as seen:
        inputs, targets = (torch.empty(t.shape, device=device_type) for t in data[0])
        attempt(fn, model, optimizer, scaler, inputs, targets, nn.MSELoss(), MAX_NORM)
    return simulated_problems(seen, torch.float16)


def _scenario_problems(fn: StepFn, scenario: Scenario) -> tuple[list[Problem], bool]:
    """The problems of one scenario, and whether its result is the reference answer's."""
    outcome = _run(fn, scenario)
    problems = _step_problems(outcome, scenario) + outcome.left
    error = next((run for run in outcome.runs if run.error is not None), None)
    difference = math.inf if error else reference_difference(outcome, scenario)
    if error is None:
        problems += _result_problems(outcome, scenario, bool(problems))
        if not problems and difference > REFERENCE_RTOL:
            losses = ", ".join(f"{float(run.value):.6g} vs {r:.6g}" for run, r in
                               zip(outcome.runs, _reference(scenario)[0], strict=False))
            problems.append(Problem.named(
                NOT_LIKE_REFERENCE, f"After {scenario.steps} steps with {scenario.optimizer} "
                f"the result differs from a right answer's on the same batches (losses, yours "
                f"vs right: {losses}; up to {difference:.2%} apart, relatively, in the losses, "
                f"the parameters' change or the scale, where right answers stay within "
                f"{REFERENCE_RTOL:.2%}).", "Float16 is for the forward pass under autocast: the "
                "loss, its targets, the gradients after unscale_ and the update stay in "
                "float32; math done in 16 bits anywhere else rounds the result.", "compute "
                "the loss inside autocast with loss_fn(model(inputs), targets) (it runs in "
                "float32 there) and change nothing else in the step."))
    elif crashed := _error_problem(error, bool(problems)):
        problems.append(crashed)  # last: often GradScaler refusing a call order named above
    return problems, difference <= REFERENCE_RTOL


# What only describes a result: where the result is the reference's in every scenario, none of
# these rejects the answer (a different spelling of the same step is right).
RESULT_KEYS = frozenset({
    LOSS_NOT_LIKE_FP32, PARAMS_NOT_LIKE_FP32, OVERFLOW_NOT_HANDLED, NOT_LIKE_REFERENCE,
    RETURNED_SCALED_LOSS, CLIP_WITHOUT_UNSCALE, CLIP_BEFORE_UNSCALE, NOT_CLIPPED})


def _error_problem(run: Attempt, after_others: bool) -> Problem | None:
    """checking.error_problem, except for a call stopped because the check's shared budget
    (CHECK_BUDGET_S for all calls together) ran out: error_problem reports the seconds of that
    last call alone (what was left of the budget), not the time the check spent."""
    if run.timed_out and run.seconds and run.seconds < checking.TIME_LIMIT_S - 0.5:
        return Problem.named(
            checking.TIMED_OUT, f"fp16_step used up the {checking.CHECK_BUDGET_S:g} seconds "
            "this check gives all its calls together (one call per batch, in every scenario), "
            f"so the checker stopped it: the last call was stopped after {run.seconds:.0f} s, "
            "when the rest of that time ran out.", "A correct answer takes well under a second "
            "per call here; a loop that never ends, or one far longer than it needs, is the "
            "usual cause.", "make every loop run a fixed number of times, and do one step per "
            "call.")
    return error_problem(run, "fp16_step", after_others=after_others)
