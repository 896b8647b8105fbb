"""The ``train_accumulated`` exercise (lesson 05): gradient accumulation with a GradScaler.

``check_train_accumulated(fn)`` judges the result first: it runs the learner's function and the
reference answer (``exercises.solutions.train_accumulated``) side by side on the CPU, on the same
scenarios (float16 with a GradScaler, float16 with clipping, bfloat16 with a disabled scaler,
with and without clipping, float16 on targets ten times larger, whose gradient norm is above 1
with no clipping asked for, and float16 from a scale so high that the first groups overflow and
their steps are skipped), each over ``n_micro`` micro-batches in groups of ``k``; the counts are
drawn from a seeded generator (:func:`draw_scenarios`) so that most do not divide, one does, and
the last group is shorter by one or more. An answer whose parameters, returned losses and scale
match the reference's (within :data:`REFERENCE_RTOL`) in every scenario is right, however it is
written; only the rules the lesson states in words (what the call leaves behind, graphs held
across micro-batches) reject it beyond that.

Where the results differ, an :class:`AccumulationSpy` (a ``TrainingSpy`` that also knows where
each group starts and ends) says why: it watches the order of the calls; at every optimizer step
it keeps the parameters and gradients, and the checker compares each step's gradient with fp32
autograd on the group's micro-batches taken as one big batch, at the same parameters, and the
norm the step used with the one clipping asks for (max_grad_norm, or none).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import random
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn

from amp_tutorial.exercises.checking import (
    WRONG_RETURN,
    Attempt,
    CheckResult,
    Exercise,
    Problem,
    attempt,
    error_problem,
    left_behind,
    type_problem,
)
from amp_tutorial.exercises.solutions.train_accumulated import (
    train_accumulated as reference_answer,
)
from amp_tutorial.exercises.training_spy import (
    CLIP_BEFORE_UNSCALE,
    CLIPPED_WITHOUT_MAX,
    FORWARD_NOT_AUTOCAST,
    GRADS_NOT_ZEROED,
    NO_SCALER_UPDATE,
    NOT_CLIPPED,
    OPTIMIZER_STEP_DIRECT,
    OVER_CLIPPED,
    STEPPED_TWICE,
    WRONG_AUTOCAST_DTYPE,
    TrainingSpy,
    check_against_reference,
    shared_problems,
    simulated_device,
    simulated_problems,
)

# The problem: 8 micro-batches of 32 samples, stepped in groups of 3.
N_MICRO = 8
MICRO_BATCH_SIZE = 32
ACCUMULATION = 3  # groups of 3, 3 and 2 micro-batches: the last group is shorter
LEARNING_RATE = 0.05  # SGD: a step is proportional to the gradient, so a wrong sum shows
INIT_SCALE = 2.0**8  # a modest start: no overflow here even if the loss is not divided
MAX_GRAD_NORM = 0.1  # below the accumulated gradient's norm (0.3 to 0.5): clipping clips
LOOSE_GRAD_NORM = 2.0  # above it: a right clip leaves the gradient alone; one without min(1, .)
# scales it up
LARGE_TARGETS = 10.0  # targets times 10: gradient norms above 1, where a default clip would fire
SKIPPING_SCALE = 2.0**20  # float16's first groups overflow at this scale: their steps are skipped
# (the reference backs off twice over 8 micro-batches in groups of 3)
REFERENCE_RTOL = 2e-4  # measured: right answers stay within 3e-5 of the reference's losses and
# 4e-6 of its parameters (dividing the gradients after unscale_ rounds differently, and float16
# forward passes amplify that); a group's loss summed in float16 is off by up to 5e-4
SEED = 5  # the scenarios' draw (lesson 05)
# (micro-batches, accumulation_steps) to draw from: mostly counts that do not divide, with the
# last group 1 to 3 shorter; one that divides
SHAPES = ((7, 3), (8, 3), (10, 4), (11, 4), (7, 2), (9, 4), (8, 4))
GRAD_RTOL = 0.03  # measured: correct runs stay within 0.1% (float16) and 0.8% (bfloat16) of
LOSS_RTOL = 0.03  # fp32's gradient and loss on the same big batch; a mistake is off by 33%+
DEVICE_TYPE = "cpu"  # float16 and bfloat16 autocast and GradScaler("cpu") all run on the CPU

# Problem keys: one per mistake the checker can name.
LOSS_NOT_DIVIDED = "loss-not-divided"
REMAINDER_DIVIDED_BY_K = "remainder-divided-by-k"
STEPPED_MID_GROUP = "stepped-mid-group"
REMAINDER_SKIPPED = "remainder-skipped"
WRONG_GROUPS = "wrong-groups"
GRAPHS_HELD = "graphs-held"
UPDATE_MID_GROUP = "update-mid-group"
ZEROED_MID_GROUP = "zeroed-mid-group"
UNSCALED_MID_GROUP = "unscaled-mid-group"
SCALER_REPLACED = "scaler-replaced"
GRADIENT_NOT_LIKE_FP32 = "gradient-not-like-fp32"
BAD_LOSSES = "bad-losses"
NOT_LIKE_REFERENCE = "not-like-reference"
CLIP_WITHOUT_UNSCALE = "clip-without-unscale"  # fp16_step's key for the same mistake
__all__ = ["check_train_accumulated", "group_sizes"]
PRAISE = ("All checks passed: one scaled backward per micro-batch, one step and update per "
          "group (the short last group too), zeroing between groups only, and every step's "
          "gradient matches fp32 on the group as one batch (float16 and bfloat16).")
EXERCISE = Exercise("05", "train_accumulated", PRAISE, loops=(
    "the loop over the groups: `range(0, len(micro_batches), accumulation_steps)` visits each "
    "group once; a `while` whose index never advances by accumulation_steps does not end"))


@dataclass(frozen=True)
class Scenario:
    """One run: the autocast dtype (float16 gets an enabled scaler), optional clipping, the
    targets' scale, the scaler's first scale, and the counts: ``n_micro`` micro-batches in groups
    of ``k``."""

    name: str
    amp_dtype: torch.dtype
    max_grad_norm: float | None = None
    target_scale: float = 1.0
    init_scale: float = INIT_SCALE
    n_micro: int = N_MICRO
    k: int = ACCUMULATION

    def new_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(DEVICE_TYPE, init_scale=self.init_scale,
                                    enabled=self.amp_dtype == torch.float16)


# What each scenario is for: the rules the lesson states, each exercised by one of them.
RULES = (
    Scenario("float16", torch.float16),
    Scenario("float16 + clipping", torch.float16, MAX_GRAD_NORM),
    Scenario("bfloat16, disabled scaler", torch.bfloat16),
    Scenario("bfloat16 + clipping", torch.bfloat16, MAX_GRAD_NORM),
    Scenario("float16, max_grad_norm above the gradient norm", torch.float16, LOOSE_GRAD_NORM),
    Scenario("float16, gradient norm above 1", torch.float16, target_scale=LARGE_TARGETS),
    Scenario("float16, steps skipped", torch.float16, init_scale=SKIPPING_SCALE),
)


def draw_scenarios(seed: int = SEED) -> tuple[Scenario, ...]:
    """:data:`RULES`, the first with the course's counts (8 in groups of 3), the others with
    counts drawn from :data:`SHAPES`, every shape used once before any is used twice."""
    rng = random.Random(seed)
    shapes = rng.sample(SHAPES, len(SHAPES))
    return (RULES[0], *(dataclasses.replace(rule, n_micro=n, k=k) for rule, (n, k) in
                        zip(RULES[1:], shapes, strict=False)))


SCENARIOS = draw_scenarios()
Batches = list[tuple[torch.Tensor, torch.Tensor]]


def times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def group_sizes(n_micro: int, k: int) -> list[int]:
    """The contract: groups of ``k`` micro-batches in order, the last one shorter if need be."""
    return [min(k, n_micro - start) for start in range(0, n_micro, k)]


def make_micro_batches(seed: int = 0, target_scale: float = 1.0, n_micro: int = N_MICRO
                       ) -> tuple[nn.Module, Batches]:
    """A small tanh MLP and ``n_micro`` micro-batches of a smooth regression, on the CPU.

    tanh, not ReLU: a ReLU input near zero can flip sign between float16 and fp32 and move the
    gradient by several percent; with tanh a correct run stays within 1% of fp32 (measured).
    Seeded without touching the global random state.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                              nn.Linear(32, 1))
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(8, 1, generator=generator)
    inputs = torch.randn(n_micro * MICRO_BATCH_SIZE, 8, generator=generator)
    targets = torch.sin(inputs @ direction) * target_scale
    return model, list(zip(inputs.chunk(n_micro), targets.chunk(n_micro), strict=True))


@dataclass
class Snapshot:
    """The state at one optimizer step: which micro-batches it used, parameters, gradients."""

    first: int
    end: int
    params: list[torch.Tensor]
    grads: list[torch.Tensor | None]


class AccumulationSpy(TrainingSpy):
    """A :class:`TrainingSpy` that counts micro-batches between steps and what ran in a group."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scenario: Scenario,
                 scaler: torch.amp.GradScaler) -> None:
        super().__init__(model, optimizer, scenario, DEVICE_TYPE)
        self.given_scaler = scaler
        self.count.update(dict.fromkeys(
            ["stepped_mid_group", "graphs_held", "update_without_step", "step_without_update",
             "zeroed_mid_group", "group_not_zeroed", "unscaled_mid_group", "other_scaler",
             "step_direct", "stepped_twice_in_group", "clipped_before_unscale",
             "clipped_without_unscale", "step_direct_unscaled"], 0))
        self.forwards = self.backwards = 0  # since the last step: this group so far
        self.done = 0  # micro-batches behind the steps so far
        self.sizes: list[int] = []  # micro-batches per step, as the learner grouped them
        self.snapshots: list[Snapshot] = []
        self.unscaled_grads: list[torch.Tensor | None] | None = None  # right after unscale_
        self.step_grads: list[torch.Tensor | None] | None = None  # those of the step now running
        self.stepped = 0  # enabled scaler.step calls since the last update
        self.unscaled_by_hand = False  # unscale_ called (a disabled scaler's too) since backward
        self.left: list[Problem] = []  # what the call left behind (checking.left_behind)
        self.last_call = ""  # the call that began the last step, for a group stepped twice
        self.twice_calls: list[str] = []  # the calls of the first group stepped twice
        self.direct_since_update = False  # optimizer.step() by hand with an enabled scaler
        self.repeating = False  # the scaler.step now running steps a group stepped already

    def group_size(self) -> int:
        """How many micro-batches the group now running should have, by the contract."""
        return min(self.scenario.k, max(self.scenario.n_micro - self.done, 1))

    def on_forward(self, module: nn.Module, args: tuple) -> None:
        if torch.is_grad_enabled():
            self.count["graphs_held"] += self.forwards > self.backwards
            self.forwards += 1
        super().on_forward(module, args)

    def backward(self, original: Callable, tensors, *args, **kwargs):
        has = any(p.grad is not None and bool(p.grad.count_nonzero()) for p in self.params)
        if has and not self.backwards:  # a new group starts on the last group's gradients
            self.count["group_not_zeroed"] += 1
        elif self.backwards and not has:  # the group's earlier backward calls were wiped
            self.count["zeroed_mid_group"] += 1
        self.count["unscaled_mid_group"] += self.unscaled_by_hand
        self.backwards += 1
        self.unscaled_grads, self.unscaled_by_hand = None, False
        return super().backward(original, tensors, *args, **kwargs)

    def scale(self, original: Callable, scaler: torch.amp.GradScaler, outputs):
        self.count["other_scaler"] += scaler.is_enabled() and scaler is not self.given_scaler
        return super().scale(original, scaler, outputs)

    def unscale_(self, original: Callable, scaler: torch.amp.GradScaler, optimizer):
        inside_step = self.in_scaler_step  # step() unscales for you
        if scaler.is_enabled() and not inside_step:
            self.count["step_without_update"] += self.stepped > 0
        self.unscaled_by_hand = self.unscaled_by_hand or not inside_step
        before = self.count["modified_before_unscale"]  # a clip (or any change) came first
        result = super().unscale_(original, scaler, optimizer)
        if not inside_step:  # inside scaler.step: counted there, as no unscale_ at all
            self.count["clipped_before_unscale"] += self.count["modified_before_unscale"] - before
        if scaler.is_enabled() and not inside_step:  # the gradients before any clipping; a
            self.unscaled_grads = self.grads()  # backward before the step is a mistake
        return result

    def grads(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.detach().clone() for p in self.params]

    def stepping(self, call: str) -> bool:
        """An optimizer step begins (through ``scaler.step`` or directly, ``call``): the group
        ends. False where no forward pass ran since the last step: the same group stepped again
        (``scaler.step`` and ``optimizer.step()`` both, or ``scaler.step`` twice)."""
        if not self.forwards and self.sizes:
            self.count["stepped_twice_in_group"] += 1
            self.twice_calls = self.twice_calls or [self.last_call, call]
            return False
        if call == "optimizer.step()" and self.given_scaler.is_enabled():
            self.count["step_direct"] += 1  # the scaler's unscaling and skipping bypassed
            self.count["step_direct_unscaled"] += self.unscaled  # unscale_ ran first
            self.direct_since_update = True
        self.last_call = call
        self.count["stepped_mid_group"] += self.forwards < self.group_size()
        self.sizes.append(self.forwards)
        self.first, self.done = self.done, self.done + self.forwards
        self.forwards = self.backwards = 0
        self.step_grads, self.unscaled_grads = self.unscaled_grads, None
        self.unscaled_by_hand = False
        return True

    def step(self, original: Callable, scaler: torch.amp.GradScaler, optimizer, *args, **kwargs):
        again = self.repeating = not self.stepping("scaler.step(optimizer)")
        if scaler.is_enabled():
            self.count["step_without_update"] += self.stepped > 0 and not again
            self.stepped += 1
        before = self.count["modified_before_unscale"]  # counted in here: no unscale_ came first
        try:
            return super().step(original, scaler, optimizer, *args, **kwargs)
        finally:
            self.count["clipped_without_unscale"] += (self.count["modified_before_unscale"]
                                                      - before)

    def update(self, original: Callable, scaler: torch.amp.GradScaler, *args, **kwargs):
        if scaler.is_enabled():
            self.count["update_without_step"] += self.stepped == 0 and not (
                self.direct_since_update)  # a step by hand is named as such
            self.stepped, self.direct_since_update = 0, False
        return super().update(original, scaler, *args, **kwargs)

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        again = self.repeating if self.in_scaler_step else not self.stepping("optimizer.step()")
        super().on_optimizer_step(optimizer, args, kwargs)
        if again:
            return  # named as a group stepped twice
        self.snapshots.append(Snapshot(self.first, self.done,
                                       [p.detach().clone() for p in self.params],
                                       self.step_grads or self.pre_clip or self.grads()))


@dataclass(frozen=True)
class Outcome:
    """What a run leaves to compare: the returned losses, the parameters, the scaler's scale."""

    losses: tuple[float, ...] | None
    params: torch.Tensor
    scale: float

    @classmethod
    def of(cls, losses: object, model: nn.Module, scaler: torch.amp.GradScaler) -> Outcome:
        try:
            values = tuple(float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
                           for v in losses)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            values = None
        return cls(values, torch.cat([p.detach().flatten() for p in model.parameters()]),
                   scaler.get_scale())

    def difference(self, reference: Outcome, skips: bool = False) -> float | None:
        """The largest relative difference from ``reference`` (None: the losses cannot be
        compared, a different count or not numbers). ``skips``: the scaler skips steps here,
        and a right answer that scales by another route (the gradients divided after unscale_)
        overflows at other steps; then only the first group's loss, before any step, and finite
        parameters are compared."""
        if self.losses is None or reference.losses is None or (
                len(self.losses) != len(reference.losses)):
            return None
        if skips:
            first = abs(self.losses[0] - reference.losses[0]) / abs(reference.losses[0])
            return first if bool(self.params.isfinite().all()) else math.inf
        params = ((self.params - reference.params).norm() / reference.params.norm()).item()
        losses = max((abs(a - b) / abs(b) for a, b in zip(self.losses, reference.losses,
                                                          strict=True) if b), default=0.0)
        scale = abs(self.scale - reference.scale) / reference.scale
        return max(params, losses, scale) if math.isfinite(params) else math.inf


def _problem(scenario: Scenario
             ) -> tuple[nn.Module, Batches, torch.optim.Optimizer, torch.amp.GradScaler]:
    model, micro_batches = make_micro_batches(target_scale=scenario.target_scale,
                                              n_micro=scenario.n_micro)
    return (model, micro_batches, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE),
            scenario.new_scaler())


@functools.cache
def _reference(scenario: Scenario) -> Outcome:
    """What the reference answer leaves on ``scenario``."""
    model, micro_batches, optimizer, scaler = _problem(scenario)
    losses = reference_answer(model, optimizer, scaler, micro_batches, nn.MSELoss(), scenario.k,
                              DEVICE_TYPE, scenario.amp_dtype, scenario.max_grad_norm)
    return Outcome.of(losses, model, scaler)


def _run(fn: Callable[..., object], scenario: Scenario
         ) -> tuple[AccumulationSpy, Attempt, Batches, Outcome]:
    model, micro_batches, optimizer, scaler = _problem(scenario)
    spy = AccumulationSpy(model, optimizer, scenario, scaler)
    given = list(micro_batches)  # the caller's list: it must be left as it was
    with ExitStack() as stack:
        spy.install(stack)
        with left_behind("train_accumulated", models={"model": model},
                         lists={"micro_batches": given}) as spy.left:
            run = attempt(fn, model, optimizer, scaler, given, nn.MSELoss(),
                          scenario.k, DEVICE_TYPE, scenario.amp_dtype,
                          max_grad_norm=scenario.max_grad_norm)
    if run.error is None and spy.stepped:  # the last step was never followed by update()
        spy.count["step_without_update"] += 1
    return spy, run, micro_batches, Outcome.of(run.value, model, scaler)


# (what the spy counted, the key, what is wrong with {n} for how often, why it matters, the fix)
RULES = [
    ("forward_no_autocast", FORWARD_NOT_AUTOCAST, "A forward pass ran without autocast ({n}).",
     "The micro-batches then train in fp32, not in mixed precision.", "run each micro-batch's "
     "forward and loss inside `with torch.autocast(device_type=device_type, dtype=amp_dtype):`."),
    ("forward_wrong_dtype", WRONG_AUTOCAST_DTYPE, "Autocast ran in {dtypes}, not the "
     "amp_dtype given, {amp_dtype} ({n}).", "The caller picked amp_dtype for the device: "
     "float16 with a GradScaler where there is no fast bfloat16, bfloat16 where there is.",
     "pass it on: `torch.autocast(device_type=device_type, dtype=amp_dtype)`."),
    ("other_scaler", SCALER_REPLACED, "scale() was called on a GradScaler other than the "
     "`scaler` argument ({n}).", "A new GradScaler starts again at its init_scale (65536 unless "
     "you pass another) with its growth count at 0, so the scale the run has learnt is lost, and "
     "the caller's scaler (the one a checkpoint saves) never changes.", "use the scaler passed "
     "in, for every group; never create one inside the function."),
    ("stepped_mid_group", STEPPED_MID_GROUP, "The optimizer stepped before a group was complete "
     "({n}): {sizes}.", "Each step then uses only part of the group's gradient: the effective "
     "batch is smaller than the accumulation asks for.", "call scaler.step(optimizer) and "
     "scaler.update() once per group of accumulation_steps micro-batches, after its last "
     "backward."),
    ("step_direct", OPTIMIZER_STEP_DIRECT, "optimizer.step() was called directly at the end "
     "of a group instead of scaler.step(optimizer) ({n}).", "scaler.step unscales the group's "
     "gradients if you have not, and skips the step when they hold inf/NaN: a direct call "
     "applies gradients still multiplied by the scale, or overflowed ones, and scaler.update() "
     "then finds no inf checks and raises AssertionError('No inf checks were recorded prior to "
     "update.').", "call scaler.step(optimizer) once per group, then scaler.update()."),
    ("stepped_twice_in_group", STEPPED_TWICE, "The optimizer stepped twice at the end of a "
     "group, with no micro-batch between ({n}; your code called: {twice}).", "scaler.step("
     "optimizer) calls optimizer.step() for you (unless it skips the step): a second step "
     "applies the group's gradient again, and a second scaler.step before update() makes "
     "GradScaler raise RuntimeError('step() has already been called since the last update().').",
     "call scaler.step(optimizer) once per group, not optimizer.step() as well, then "
     "scaler.update()."),
    ("graphs_held", GRAPHS_HELD, "A micro-batch's forward pass started before the previous "
     "one's backward ran ({n}): the group's losses were kept, or summed, and backpropagated "
     "together.", "The gradient is the same, but every micro-batch's activations stay in memory "
     "until that backward, which is what accumulation exists to avoid.", "call "
     "scaler.scale(loss / len(group)).backward() right after each micro-batch's forward pass."),
    ("update_without_step", UPDATE_MID_GROUP, "scaler.update() ran inside a group, with no "
     "scaler.step(optimizer) since the last update ({n}).", "The scale must stay "
     "the same while a group's gradients add up, and update() sets it from the inf checks of the "
     "step before it; with none recorded, GradScaler raises AssertionError('No inf checks were "
     "recorded prior to update.').", "call scaler.update() once per "
     "group, right after scaler.step(optimizer)."),
    ("step_without_update", NO_SCALER_UPDATE, "scaler.step(optimizer) was not followed by "
     "scaler.update() ({n}).", "The scale then never backs off after an overflow nor grows after "
     "good steps, and GradScaler refuses the next group: RuntimeError('step() has already been "
     "called since the last update().'), or 'unscale_() is being called after step().' (torch "
     "2.14, any device).", "call scaler.update() once per group, right after "
     "scaler.step(optimizer)."),
    ("zeroed_mid_group", ZEROED_MID_GROUP, "The gradients were zeroed between micro-batches of a "
     "group ({n}).", "Only the last micro-batch's gradient reached each step: nothing "
     "accumulated.", "zero once per group: before its first micro-batch, or after scaler.step "
     "and scaler.update."),
    ("group_not_zeroed", GRADS_NOT_ZEROED, "A group started on the previous group's gradients "
     "({n}).", "backward() adds into .grad, so every step applied all earlier groups' gradients "
     "again.", "call optimizer.zero_grad() once per group, before its first micro-batch or after "
     "scaler.step and scaler.update."),
    ("unscaled_mid_group", UNSCALED_MID_GROUP, "scaler.unscale_(optimizer) ran before the "
     "group's last micro-batch: a backward followed it in the same group ({n}).", "unscale_ "
     "divides the gradients so far by the scale, and the next backward adds scaled gradients to "
     "them; GradScaler allows one unscale_ per optimizer between updates and raises "
     "RuntimeError('unscale_() has already been called on this optimizer since the last "
     "update().') on the second.", "after the group's last backward: "
     "scaler.unscale_(optimizer), clip, scaler.step(optimizer)."),
    ("clipped_before_unscale", CLIP_BEFORE_UNSCALE, "The gradients were changed (clipped?) "
     "after the group's last backward and before scaler.unscale_(optimizer) ({n}).", "They "
     "were still multiplied by the scale, so clip_grad_norm_ measured and clipped the scaled "
     "norm (max_grad_norm acted like max_grad_norm / scale on the true gradients).", "after the "
     "group's last backward: scaler.unscale_(optimizer) first, then clip, then "
     "scaler.step(optimizer)."),
    ("clipped_without_unscale", CLIP_WITHOUT_UNSCALE, "The gradients were changed (clipped?) "
     "after the group's last backward and scaler.unscale_(optimizer) was never called: "
     "scaler.step unscaled them only afterwards ({n}).", "clip_grad_norm_ measured the scaled "
     "norm, scale times the true one, so max_grad_norm acted like max_grad_norm / scale: the "
     "clip fired on every group and the steps came out about scale times too short.", "after "
     "the group's last backward: scaler.unscale_(optimizer), then clip, then "
     "scaler.step(optimizer) (it knows the gradients are unscaled already)."),
    ("not_clipped", NOT_CLIPPED, f"max_grad_norm={MAX_GRAD_NORM} was given, but the optimizer "
     "stepped with a larger gradient norm ({n}).", "The clipping the caller asked for did not "
     "happen.", "once per group, after its last backward: scaler.unscale_(optimizer), then "
     "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm), then "
     "scaler.step(optimizer)."),
    ("over_clipped", OVER_CLIPPED, f"max_grad_norm={MAX_GRAD_NORM} was given, but the optimizer "
     "stepped with a gradient norm of {clipped:.3g}, well below it, although the group's "
     "gradient was larger ({n}).", "Clipping scales the gradient down to max_grad_norm, no "
     "further: a smaller norm is a smaller step than the caller asked for (dividing "
     "max_grad_norm by the group's size, or clipping each micro-batch, does this).", "clip once "
     "per group, after scaler.unscale_(optimizer): torch.nn.utils.clip_grad_norm_("
     "model.parameters(), max_grad_norm), with max_grad_norm as given."),
    ("clipped_without_limit", CLIPPED_WITHOUT_MAX, "max_grad_norm was None, but the gradient "
     "was clipped: the optimizer stepped with a norm of {clipped:.3g} where the group's gradient "
     "was larger ({n}).", "None means no clipping: a default such as 1.0 shortens every step "
     "whose gradient norm is above it.", "clip only `if max_grad_norm is not None:`."),
]


# optimizer.step() called directly after scaler.unscale_(optimizer): the gradients were unscaled,
# and update() finds the inf checks unscale_ recorded, so nothing raises.
STEP_DIRECT_UNSCALED = (
    "optimizer.step() was called directly at the end of a group, after "
    "scaler.unscale_(optimizer), instead of scaler.step(optimizer) ({n}).",
    "The gradients were unscaled, but a direct step is taken whatever they hold: when a "
    "group's gradients overflow (inf/NaN), the step scaler.step would skip is applied, and "
    "inf/NaN go into the weights (scaler.update() still backs the scale off, since unscale_ "
    "recorded the overflow, but the weights are already lost).")


def _process_problems(spy: AccumulationSpy, run: Attempt) -> list[Problem]:
    """Mistakes in the order of the calls, from what the spy counted."""
    c, k, n, found = spy.count, spy.scenario.k, spy.scenario.n_micro, []
    expected = group_sizes(n, k)
    sizes = f"{spy.sizes} micro-batches per step where the contract asks for {expected}"
    for count, key, what, why, fix in RULES:
        if count == "step_direct" and c["step_direct_unscaled"]:
            what, why = STEP_DIRECT_UNSCALED
        if c[count]:
            found.append(Problem.named(key, what.format(
                n=times(c[count]), sizes=sizes, clipped=spy.clipped_to,
                twice=", ".join(spy.twice_calls),
                dtypes=", ".join(map(str, sorted(spy.wrong_dtypes, key=str))),
                amp_dtype=spy.scenario.amp_dtype), why, fix))
    found += shared_problems(spy, spy.scenario.max_grad_norm) + spy.left
    if run.error is None and not found and spy.sizes != expected:
        if spy.sizes == expected[:-1] and n % k:
            found.append(Problem.named(
                REMAINDER_SKIPPED, f"The last {n % k} micro-batches (a group shorter than "
                f"accumulation_steps={k}) got no optimizer step: {sizes}.", "Their data never "
                "trains the model, and their gradients stay in .grad for whoever steps next.",
                "step the short last group too, its losses divided by its own size "
                "(len(group)), e.g. `for start in range(0, len(micro_batches), k):`."))
        else:
            found.append(Problem.named(
                WRONG_GROUPS, f"The optimizer stepped after {sizes}.", "Each step must use "
                "one group of consecutive micro-batches.", f"step after every "
                f"accumulation_steps={k} micro-batches, and once more after a shorter last "
                "group."))
    if crashed := error_problem(run, "train_accumulated", after_others=bool(found)):
        found.append(crashed)
    return found


def _fp32_group(model: nn.Module, snapshot: Snapshot, micro_batches: Batches
                ) -> tuple[torch.Tensor, float]:
    """fp32's gradient and loss of the snapshot's group of micro-batches as one batch."""
    with torch.no_grad():
        for p, value in zip(model.parameters(), snapshot.params, strict=True):
            p.copy_(value)
    model.zero_grad(set_to_none=True)
    inputs, targets = (torch.cat(t) for t in zip(*micro_batches[snapshot.first:snapshot.end],
                                                 strict=True))
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]), loss.item()


def _gradient_problems(spy: AccumulationSpy, micro_batches: Batches
                       ) -> tuple[list[Problem], list[float]]:
    """Each step's gradient (before clipping) against fp32 autograd on its group as one batch,
    at the same parameters; also returns fp32's loss of each group, for the returned losses."""
    k, r = spy.scenario.k, spy.scenario.n_micro % spy.scenario.k
    model, _ = make_micro_batches()
    verdicts, reference_losses = [], []
    for i, snapshot in enumerate(spy.snapshots):
        reference, loss = _fp32_group(model, snapshot, micro_batches)
        reference_losses.append(loss)
        grad = torch.cat([(torch.zeros_like(p) if g is None else g).flatten()
                          for p, g in zip(snapshot.params, snapshot.grads, strict=True)])
        error = ((grad - reference).norm() / reference.norm()).item()
        if error <= GRAD_RTOL:
            continue
        ratio = (grad.norm() / reference.norm()).item()
        parallel = nn.functional.cosine_similarity(grad, reference, dim=0).item() > 0.999
        size = snapshot.end - snapshot.first
        if parallel and size > 1 and math.isclose(ratio, size, rel_tol=0.05):
            verdicts.append((LOSS_NOT_DIVIDED, i, ratio, error))
        elif parallel and size == r and math.isclose(ratio, r / k, rel_tol=0.05):
            verdicts.append((REMAINDER_DIVIDED_BY_K, i, ratio, error))
        else:
            verdicts.append((GRADIENT_NOT_LIKE_FP32, i, ratio, error))
    return _gradient_verdict(verdicts, k, r), reference_losses


def _gradient_verdict(verdicts: list[tuple[str, int, float, float]], k: int, r: int
                      ) -> list[Problem]:
    """One problem for the steps whose gradient is off: the mistake their ratio points at
    (``k`` micro-batches per group, ``r`` in the short last one)."""
    keys = {v[0] for v in verdicts}
    if LOSS_NOT_DIVIDED in keys:
        return [Problem.named(
            LOSS_NOT_DIVIDED, f"Each group's gradient was fp32's gradient of its micro-batches "
            f"taken as one batch times the group's size ({k} for a full group): the "
            "micro-batch losses were added up, not averaged.", f"With SGD (as here) every "
            f"full group's step is {k} times too long, and clip_grad_norm_ sees a norm that "
            "grows with accumulation_steps.", "divide "
            "each micro-batch's loss by the group's size before backward: "
            "scaler.scale(loss / len(group)).backward().")]
    if keys == {REMAINDER_DIVIDED_BY_K}:
        return [Problem.named(
            REMAINDER_DIVIDED_BY_K, f"The last group ({r} micro-batches) gave {r}/{k} of "
            f"fp32's gradient for those {r} micro-batches as one batch: its losses were divided "
            f"by accumulation_steps={k}, not by its own size.", "That step is shorter than "
            "the others: its micro-batches count less.", "divide by the group's size, "
            "`len(group)`, which is accumulation_steps except for the last group.")]
    if verdicts:
        _, i, ratio, error = next(v for v in verdicts if v[0] == GRADIENT_NOT_LIKE_FP32)
        return [Problem.named(
            GRADIENT_NOT_LIKE_FP32, f"Step {i + 1}'s gradient differs from fp32's gradient of "
            f"its micro-batches taken as one batch by {error:.1%} (norm ratio {ratio:.3g}; a "
            f"correct run stays within {GRAD_RTOL:.0%} here).", "The step does not follow "
            "the big-batch training that accumulation stands in for.", "per micro-batch: "
            "forward and loss under autocast, then scaler.scale(loss / len(group)).backward(); "
            "per group: unscale_ and clip if asked, scaler.step, scaler.update, zero_grad.")]
    return []


LOSSES_FIX = ("return a list with one float per optimizer step: the sum of its "
              "(loss / len(group)).item() values, the group's mean loss.")


def _type_problems(losses: object) -> list[Problem]:
    """The returned value must be a list (or tuple) of plain numbers."""
    if wrong := type_problem(losses, (list, tuple), "train_accumulated", "a list of floats",
                             LOSSES_FIX):
        return [wrong]
    if not all(isinstance(v, numbers.Real) for v in losses):
        kinds = ", ".join(sorted({type(v).__name__ for v in losses}))
        return [Problem.named(WRONG_RETURN, f"train_accumulated returned a list of {kinds}.",
                              "The caller needs plain floats (a loss tensor also keeps its "
                              "autograd graph alive).", "append loss.item(), not loss.")]
    return []


def _loss_problems(losses: Sequence[float], reference: Sequence[float], n_steps: int,
                   n_micro: int) -> list[Problem]:
    """One loss per step, each the group's mean micro-batch loss (fp32's on the big batch)."""
    values = [float(v) for v in losses]
    if len(values) != n_steps:
        per = " (one per micro-batch)" if len(values) == n_micro else ""
        return [Problem.named(
            BAD_LOSSES, f"train_accumulated returned {len(values)} losses{per} for {n_steps} "
            "optimizer steps.", "The contract is one loss per optimizer step.", LOSSES_FIX)]
    if len(reference) != n_steps:  # a step was skipped (inf/NaN): no reference for it
        return []
    worst = max((abs(v - r) / r for v, r in zip(values, reference, strict=True)), default=0.0)
    if not all(map(math.isfinite, values)) or worst > LOSS_RTOL:
        pairs = ", ".join(f"{v:.4g} vs {r:.4g}" for v, r in zip(values, reference, strict=True))
        return [Problem.named(
            BAD_LOSSES, f"The returned losses are not the groups' mean losses (yours vs fp32 on "
            f"the same group and parameters: {pairs}).", "A group's loss is the mean of its "
            "micro-batch losses, unscaled: the loss of the big batch it stands in for.",
            LOSSES_FIX)]
    return []


# What only describes a result (a count, a gradient, a clip, the losses): where the result is
# the reference's in every scenario, none of these rejects the answer.
RESULT_KEYS = frozenset({
    LOSS_NOT_DIVIDED, REMAINDER_DIVIDED_BY_K, STEPPED_MID_GROUP, REMAINDER_SKIPPED, WRONG_GROUPS,
    UPDATE_MID_GROUP, ZEROED_MID_GROUP, UNSCALED_MID_GROUP, GRADIENT_NOT_LIKE_FP32, BAD_LOSSES,
    NOT_CLIPPED, OVER_CLIPPED, CLIPPED_WITHOUT_MAX, NO_SCALER_UPDATE, NOT_LIKE_REFERENCE,
    CLIP_BEFORE_UNSCALE, CLIP_WITHOUT_UNSCALE})


@EXERCISE.checker
def check_train_accumulated(fn: Callable[..., object]) -> CheckResult:
    """Run ``fn`` beside the reference answer on :data:`SCENARIOS` and the simulated devices,
    judge its result against the reference's, and name every mistake; a few seconds on a laptop
    CPU.

    ``fn(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps, device_type,
    amp_dtype, max_grad_norm=None)`` returns one loss per optimizer step.
    """
    return check_against_reference(EXERCISE, SCENARIOS,
                                   lambda scenario: _scenario_problems(fn, scenario),
                                   lambda device_type: _simulated(fn, device_type),
                                   {NOT_LIKE_REFERENCE}, RESULT_KEYS)


def _simulated(fn: Callable[..., object], device_type: str) -> list[Problem]:
    """``fn`` given ``device_type`` and fake micro-batches on it, up to its first forward pass:
    does its autocast follow the device type and the dtype it is given?"""
    model, micro_batches = make_micro_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    scaler = torch.amp.GradScaler(DEVICE_TYPE, init_scale=INIT_SCALE)
    with simulated_device(device_type, model) as seen:
        fake = [tuple(torch.empty(t.shape, device=device_type) for t in batch)
                for batch in micro_batches]
        attempt(fn, model, optimizer, scaler, fake, nn.MSELoss(), ACCUMULATION, device_type,
                torch.float16)
    return simulated_problems(seen, torch.float16)


def _scenario_problems(fn: Callable[..., object], scenario: Scenario
                       ) -> tuple[list[Problem], bool]:
    """The problems of one scenario, and whether its result is the reference's."""
    spy, run, micro_batches, outcome = _run(fn, scenario)
    reference = _reference(scenario)
    difference = None if run.error else outcome.difference(
        reference, skips=scenario.init_scale > INIT_SCALE)
    right = difference is not None and difference <= REFERENCE_RTOL
    problems = _process_problems(spy, run)
    if run.error is None:
        problems += _type_problems(run.value)
    if run.error is None and not problems:
        problems, reference_losses = _gradient_problems(spy, micro_batches)
        if not problems:
            problems = _loss_problems(run.value, reference_losses, len(spy.sizes),
                                      scenario.n_micro)
    if run.error is None and not problems and not right:
        mine, want = outcome.losses or (), reference.losses or ()
        difference = math.inf if difference is None else difference
        pairs = ", ".join(f"{a:.6g} vs {b:.6g}" for a, b in zip(mine, want, strict=False))
        problems.append(Problem.named(
            NOT_LIKE_REFERENCE, f"The result differs from a right answer's on the same "
            f"micro-batches ({scenario.n_micro} in groups of {scenario.k}; losses, yours vs "
            f"right: {pairs}; up to {difference:.2%} apart, relatively, in the losses, the "
            f"parameters or the scale, where two right answers stay within "
            f"{REFERENCE_RTOL:.2%}).", "Each group's "
            "step stands in for one big batch: its loss is the mean of the micro-batch losses, "
            "each taken in float32 from the autocast forward; a sum held in 16 bits, or a step "
            "or update that depends on anything but the group, gives other numbers.", "add "
            "(loss / len(group)).item() into a Python float for each micro-batch, and step, "
            "update and zero once per group."))
    return problems, right
