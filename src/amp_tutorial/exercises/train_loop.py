"""The ``train_with_amp`` exercise (lesson 06): a small problem, the reference answer, and a
checker that judges the result first and then names the mistake.

``check_train_with_amp(fn)`` trains a tiny MLP on the CPU with the learner's function and, beside
it, with the reference answer (``exercises.solutions.train_with_amp``), on the same scenarios:
float16 with and without clipping, float16 where the scaler skips steps, bfloat16, and bfloat16
with gradient norms above 1 (where a clip at a default of 1.0 shows). Their epochs, number of
batches and the size of the one short batch are drawn from a seeded generator
(:func:`draw_scenarios`), so the mean per batch, the count of batches and the skipped steps all
matter to the result. The returned history must match the reference's within
:data:`REFERENCE_RTOL`: only the order of fp32 sums may differ. A ``TrainingSpy``
(``exercises.training_spy``) watches what the code does, without relying on how it is spelled,
and names the mistake behind a difference.
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
from unittest import mock

import torch
from torch import nn

from amp_tutorial.exercises.checking import (
    Attempt,
    CheckResult,
    Exercise,
    Problem,
    attempt,
    error_problem,
    left_behind,
)
from amp_tutorial.exercises.solutions.train_with_amp import train_with_amp as reference_answer
from amp_tutorial.exercises.training_spy import (
    CLIP_BEFORE_UNSCALE,
    CLIPPED_WITHOUT_MAX,
    FORWARD_NOT_AUTOCAST,
    GRADS_NOT_ZEROED,
    GRADS_ZEROED_BEFORE_STEP,
    LOSS_NOT_SCALED,
    NO_SCALER_UPDATE,
    NOT_CLIPPED,
    OPTIMIZER_STEP_DIRECT,
    OVER_CLIPPED,
    STEPPED_TWICE,
    WRONG_AUTOCAST_DTYPE,
    TrainingSpy,
    check_on_devices,
    shared_problems,
    simulated_device,
    simulated_problems,
)

# The problem every check runs: small enough to answer in about a second on a laptop CPU.
EPOCHS = 4
N_BATCHES = 4
BATCH_SIZE = 64
LEARNING_RATE = 1e-2
MAX_GRAD_NORM = 0.1  # below the problem's gradient norm (about 0.25), so clipping really clips
LOOSE_GRAD_NORM = 1.0  # above it: a right clip leaves the gradients alone; one without min(1, .)
# scales them up
LARGE_TARGETS = 10.0  # targets times 10: gradient norms above 1, where a default clip would fire
SKIPPING_TARGETS = 100.0  # targets times 100: float16's first steps overflow, the scaler skips
REFERENCE_RTOL = 1e-4  # measured: right answers stay within 1e-7 of the reference's history
# when they sum in another order, 2e-5 with a clip written by hand (its own epsilon); a loss in 16
# bits lands 8e-5 to 2e-2 away (above 1e-3 in some scenario), a skipped step left out of the mean
# 1e-2 or more
SEED = 6  # the scenarios' draw (lesson 06)
DEVICE_TYPE = "cpu"  # fp16 and bf16 autocast and GradScaler("cpu") all work on the CPU

# Problem keys: one per mistake the checker can name.
NO_BACKWARD = "no-backward"
NO_OPTIMIZER_STEP = "no-optimizer-step"
SCALER_NOT_CARRIED = "scaler-state-not-carried"
SCALER_SHARED = "scaler-shared-across-calls"
BAD_HISTORY = "bad-loss-history"
HISTORY_NOT_LIKE_RIGHT_RUN = "history-not-like-right-run"
LAST_BATCH_LOSS = "last-batch-loss-not-epoch-mean"
__all__ = ["check_train_with_amp", "make_exercise_problem", "train_fp32"]
PRAISE = ("All checks passed: autocast, GradScaler, clipping, zeroing and the loss history are "
          "right (float16 and bfloat16).")
EXERCISE = Exercise("06", "train_with_amp", PRAISE, loops=(
    "the two loops: `for _ in range(epochs):` around `for inputs, targets in data:`; a loop "
    "that appends to `data` while iterating over it, or a `while` on the loss, does not end"))

TrainFn = Callable[..., object]


@dataclass(frozen=True)
class Scenario:
    """One run of the learner's function: the autocast dtype, an optional clipping norm, the
    targets' scale, and the problem's shape (epochs, batches, the size of the one short batch).
    """

    name: str
    amp_dtype: torch.dtype
    max_grad_norm: float | None = None
    target_scale: float = 1.0
    epochs: int = EPOCHS
    n_batches: int = N_BATCHES
    short_batch: int = BATCH_SIZE  # the size of the last batch (BATCH_SIZE: none is short)


# What each scenario is for: the rules the lesson states, each exercised by one of them.
RULES = (
    Scenario("float16", torch.float16),
    Scenario("float16 + clipping", torch.float16, MAX_GRAD_NORM),
    Scenario("float16, max_grad_norm above the gradient norm", torch.float16, LOOSE_GRAD_NORM),
    Scenario("float16, steps skipped", torch.float16, target_scale=SKIPPING_TARGETS),
    Scenario("bfloat16", torch.bfloat16),
    Scenario("bfloat16, gradient norm above 1", torch.bfloat16, target_scale=LARGE_TARGETS),
    # clipping is not GradScaler's: a clip only `if scaler.is_enabled()` never clips in bf16
    Scenario("bfloat16 + clipping", torch.bfloat16, MAX_GRAD_NORM),
)


def draw_scenarios(seed: int = SEED) -> tuple[Scenario, ...]:
    """:data:`RULES` with their shapes drawn: 3 or 4 epochs, 3 to 5 batches, the last batch
    shorter (16 to 48 samples) in all but the first, so that a mean over samples, a fixed count
    of batches or a skipped step left out of the mean changes the result."""
    rng = random.Random(seed)
    drawn = []
    for i, rule in enumerate(RULES):
        drawn.append(dataclasses.replace(
            rule, epochs=rng.choice((3, 4)), n_batches=rng.choice((3, 4, 5)),
            short_batch=BATCH_SIZE if i == 0 else rng.randint(16, 48)))
    return tuple(drawn)


SCENARIOS = draw_scenarios()


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def make_exercise_problem(seed: int = 0, n_batches: int = N_BATCHES, target_scale: float = 1.0,
                          short_batch: int = BATCH_SIZE) -> tuple[nn.Module, Batches]:
    """A small MLP and ``n_batches`` (inputs, targets) batches of a smooth regression, on the CPU
    (targets times ``target_scale``; the last batch holds ``short_batch`` samples).

    Seeded without touching the global random state, so every call returns the same problem.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                              nn.Linear(32, 1))
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(8, 1, generator=generator)
    data = []
    for i in range(n_batches):
        inputs = torch.randn(short_batch if i == n_batches - 1 else BATCH_SIZE, 8,
                             generator=generator)
        data.append((inputs, torch.sin(inputs @ direction) * target_scale))
    return model, data


def train_fp32(
    model: nn.Module,
    data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    epochs: int,
    max_grad_norm: float | None = None,
) -> list[float]:
    """Plain fp32 training, the baseline: returns the mean batch loss of each epoch.
    """
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            total += loss.item()
        history.append(total / len(data))
    return history


def _problem(scenario: Scenario) -> tuple[nn.Module, Batches, torch.optim.Optimizer]:
    model, data = make_exercise_problem(n_batches=scenario.n_batches,
                                        target_scale=scenario.target_scale,
                                        short_batch=scenario.short_batch)
    return model, data, torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)


ScalerSettings = tuple[float, float, float, int]  # init_scale, growth, backoff, growth_interval


def scaler_settings(spy: TrainingSpy) -> ScalerSettings | None:
    """The settings of the first GradScaler the learner's run used (None: none was enabled)."""
    if not spy.scalers:
        return None
    scaler = spy.scalers[0]
    return (scaler._init_scale, scaler._growth_factor, scaler._backoff_factor,
            scaler._growth_interval)


def _reference(scenario: Scenario, settings: ScalerSettings | None) -> tuple[float, ...]:
    """The history the reference answer returns on ``scenario``, its GradScaler made with the
    learner's ``settings``: a scaler that starts lower skips other steps, and that is no mistake."""
    return _reference_run(scenario, settings)[0]


def _last_batch_losses(scenario: Scenario, settings: ScalerSettings | None
                       ) -> tuple[float, ...]:
    """The reference run's loss of each epoch's last batch (a history of those is a mistake)."""
    batches = _reference_run(scenario, settings)[1]
    n = len(batches) // max(1, scenario.epochs)
    return tuple(batches[(epoch + 1) * n - 1] for epoch in range(scenario.epochs))


@functools.cache
def _reference_run(scenario: Scenario, settings: ScalerSettings | None
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The reference answer's history and every batch's loss, in order."""
    model, data, optimizer = _problem(scenario)
    batch_losses: list[float] = []

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.mse_loss(output, target)
        batch_losses.append(loss.item())
        return loss

    scaler = torch.amp.GradScaler
    made = scaler if settings is None else functools.partial(
        scaler, init_scale=settings[0], growth_factor=settings[1], backoff_factor=settings[2],
        growth_interval=settings[3])
    with mock.patch.object(torch.amp, "GradScaler", made):
        history = tuple(reference_answer(model, data, optimizer, loss_fn, scenario.epochs,
                                         DEVICE_TYPE, scenario.amp_dtype, scenario.max_grad_norm))
    return history, tuple(batch_losses)


def _run(fn: TrainFn, scenario: Scenario) -> tuple[TrainingSpy, Attempt, list[Problem]]:
    model, data, optimizer = _problem(scenario)
    spy = TrainingSpy(model, optimizer, scenario, DEVICE_TYPE)
    with ExitStack() as stack:
        spy.install(stack)
        with left_behind("train_with_amp", models={"model": model}, lists={"data": data}) as left:
            run = attempt(fn, model, data, optimizer, nn.MSELoss(), scenario.epochs, DEVICE_TYPE,
                          scenario.amp_dtype, max_grad_norm=scenario.max_grad_norm)
    if spy.count["backward"]:
        spy.close_iteration(complete=run.error is None)
    return spy, run, left


def _iterations(n: int) -> str:
    return "1 iteration" if n == 1 else f"{n} iterations"


def _process_problems(spy: TrainingSpy, scenario: Scenario, run: Attempt) -> list[Problem]:
    """Mistakes in how the step is done, from what the spy counted: each says what went wrong,
    why it matters and, once named a second time, what to write instead (``Problem.named``)."""
    c, fp16, error = spy.count, scenario.amp_dtype == torch.float16, run.error
    dtype = "torch.float16" if fp16 else "torch.bfloat16"
    found = []

    def named(key: str, what: str, why: str, fix: str) -> None:
        found.append(Problem.named(key, what, why, fix))

    if c["backward"] == 0 and error is None:
        named(NO_BACKWARD, "backward() was never called, so nothing trained.", "Without it no "
              "gradient is computed for the optimizer to use.", "call "
              "scaler.scale(loss).backward() once per batch.")
    if c["forward_no_autocast"]:
        hint = (" autocast was on, but for another device type." if c["forward_other_device"]
                else "")
        named(FORWARD_NOT_AUTOCAST, f"The forward pass ran without autocast "
              f"({c['forward_no_autocast']} of {c['forward']} forward passes).{hint}",
              "Without it every op runs in float32: no AMP at all.", "put model(inputs) and the "
              "loss inside `with torch.autocast(device_type=device_type, dtype=amp_dtype):`.")
    if c["forward_wrong_dtype"]:
        got = ", ".join(str(d) for d in spy.wrong_dtypes)
        named(WRONG_AUTOCAST_DTYPE, f"autocast ran in {got} although amp_dtype was {dtype}.",
              "The caller chose the dtype (float16 needs a GradScaler, bfloat16 does not).",
              "pass dtype=amp_dtype to torch.autocast.")
    found += shared_problems(spy, scenario.max_grad_norm)
    scaler_used = c["scale_enabled"] + c["scaler_step"] + c["update"] > 0
    if fp16 and c["backward_unscaled"]:
        if c["scale_disabled"] and not c["scale_enabled"]:
            named(LOSS_NOT_SCALED, "The loss was not scaled before backward in float16 training: "
                  "the GradScaler is disabled (enabled=False, or made for a device type that is "
                  "not available here).", "A disabled scaler returns the loss unchanged, so "
                  "small float16 gradients flush to zero.", "create it with "
                  "torch.amp.GradScaler(device_type), enabled when amp_dtype is torch.float16.")
        else:
            named(LOSS_NOT_SCALED, "backward() ran on the unscaled loss in float16 training.",
                  "Small float16 gradients flush to zero without the scale.",
                  "call scaler.scale(loss).backward().")
    if (fp16 or scaler_used) and c["optimizer_step_direct"]:
        named(OPTIMIZER_STEP_DIRECT, "optimizer.step() was called directly instead of "
              "scaler.step(optimizer).", "scaler.step unscales the gradients if you have not, "
              "and skips the step when they hold inf/NaN: a direct call applies scaled or "
              "overflowed gradients, and scaler.update() then finds no inf checks and raises "
              "AssertionError('No inf checks were recorded prior to update.').",
              "call scaler.step(optimizer), then scaler.update().")
    if c["stepped_twice"]:
        calls = ", ".join(spy.twice_calls)
        named(STEPPED_TWICE, f"The optimizer was stepped more than once in one iteration "
              f"({_iterations(c['stepped_twice'])}; between one backward() and the next your "
              f"code called: {calls}).", "Each batch gets one update; scaler.step(optimizer) "
              "calls optimizer.step() for you.", "call scaler.step(optimizer) once, not "
              "optimizer.step() as well, then scaler.update().")
    if len(spy.scalers) > 1:
        named(SCALER_NOT_CARRIED, f"{len(spy.scalers)} different GradScaler objects scaled the "
              f"losses of one training run ({c['backward']} backward calls).", "The scaler's "
              "state (the current scale and its count of good steps) must carry over from step "
              "to step: a new scaler starts again at its init_scale (65536 unless you pass "
              "another), so it cannot back off for good after an overflow or grow after good "
              "steps.", "create one GradScaler before the loops and reuse it.")
    if scaler_used and c["iterations_without_update"]:
        named(NO_SCALER_UPDATE, f"scaler.update() is missing: "
              f"{_iterations(c['iterations_without_update'])} called scaler.step(optimizer) but "
              "not scaler.update() before the next backward.", "The scale then never backs off "
              "after an overflow nor grows after good steps.", "call scaler.update() once after "
              "every scaler.step(optimizer).")
    if c["backward_not_zeroed"]:
        named(GRADS_NOT_ZEROED, f"Gradients were not zeroed between steps "
              f"({c['backward_not_zeroed']} backward calls added to the previous step's "
              "gradients).", "Each step then uses the sum of all gradients so far.",
              "call optimizer.zero_grad() once per step, before backward (set_to_none=True or "
              "False, both reset them).")
    if c["zeroed_before_step"]:
        named(GRADS_ZEROED_BEFORE_STEP, f"The gradients were zeroed after backward() and before "
              f"the optimizer step ({_iterations(c['zeroed_before_step'])}), so the step had no "
              "gradients to use.", "With a GradScaler in float16 and zero_grad(set_to_none=True) "
              "they are None, and scaler.step finds nothing to unscale (\"No inf checks were "
              "recorded for this optimizer.\"); with set_to_none=False it steps on all-zero "
              "gradients, silently (SGD does not move, Adam still moves by its momentum).",
              "zero them at the start of the iteration, before the forward pass, or after "
              "scaler.update(); never between backward and step.")
    if c["modified_before_unscale"]:
        named(CLIP_BEFORE_UNSCALE, "The gradients were changed (clipped?) while they were still "
              "multiplied by the scale: before scaler.unscale_(optimizer), or with no unscale_ "
              "at all.", "clip_grad_norm_ then measured and clipped the scaled norm: max_norm "
              "acted like max_norm / scale on the true gradients.", "call "
              "scaler.unscale_(optimizer) first, then clip, then scaler.step(optimizer).")
    if c["not_clipped"]:
        named(NOT_CLIPPED, f"max_grad_norm={scenario.max_grad_norm} was given, but "
              f"{c['not_clipped']} optimizer steps saw a larger gradient norm.", "The caller "
              "asked for every step's gradient norm to be at most max_grad_norm.", "clip with "
              "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm) after "
              "scaler.unscale_(optimizer) and before scaler.step(optimizer).")
    if c["over_clipped"]:
        named(OVER_CLIPPED, f"max_grad_norm={scenario.max_grad_norm} was given, but "
              f"{c['over_clipped']} optimizer steps saw a gradient norm well below it (last "
              f"{spy.clipped_to:.3g}) although the gradient was larger.", "Clipping scales the "
              "gradient down to max_grad_norm, no further.", "clip with "
              "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm), max_grad_norm "
              "as given.")
    if c["clipped_without_limit"]:
        named(CLIPPED_WITHOUT_MAX, f"max_grad_norm was None, but {c['clipped_without_limit']} "
              f"optimizer steps saw a clipped gradient (norm {spy.clipped_to:.3g}, below the "
              "gradient's own).", "None means no clipping: a default such as 1.0 shortens every "
              "step whose gradient norm is above it.", "clip only "
              "`if max_grad_norm is not None:`.")
    if error is None and c["backward"] and c["optimizer_step"] == 0 and not found:
        named(NO_OPTIMIZER_STEP, "The optimizer passed in never stepped, so the weights never "
              "changed.", "Only its step applies the gradients to them.", "step the optimizer "
              "you were given, through scaler.step(optimizer).")
    # last: an error is often GradScaler refusing a call order named above
    if crashed := error_problem(run, "train_with_amp", after_others=bool(found)):
        found.append(crashed)
    return found


def _history_problems(history: object, reference: Sequence[float], scenario: Scenario,
                      other_problems: bool, last_batch: Sequence[float] = ()) -> list[Problem]:
    """Mistakes in the returned loss history, judged against the reference answer's on the same
    scenario."""
    def bad(message: str) -> list[Problem]:
        return [Problem(BAD_HISTORY, message)]

    if history is None:
        return bad("train_with_amp returned None: return the list of per-epoch mean losses.")
    if isinstance(history, torch.Tensor) or not isinstance(history, Sequence):
        return bad(f"train_with_amp returned a {type(history).__name__}: return a list of "
                   "floats, one mean loss per epoch.")
    if any(isinstance(v, torch.Tensor) for v in history):
        return bad("The loss history holds tensors: append loss.item() (a float), not the loss "
                   "tensor, which also keeps every step's autograd graph alive.")
    if not all(isinstance(v, numbers.Real) for v in history):
        return bad("The loss history must hold plain numbers (floats).")
    if len(history) != len(reference):
        per_step = (" (that is one per step)"
                    if len(history) == len(reference) * scenario.n_batches else "")
        return bad(f"Expected one mean loss per epoch ({len(reference)} values for "
                   f"epochs={len(reference)}), got {len(history)}{per_step}.")
    values = [float(v) for v in history]
    if not all(math.isfinite(v) for v in values):
        return [] if other_problems else bad(f"The loss history contains inf or NaN: {values}.")
    ratio = values[0] / reference[0]
    if ratio > 100:
        return bad(f"The losses are about {ratio:.3g} times a right answer's losses: that is the "
                   "scaled loss. Record loss.item(), not scaler.scale(loss).item().")
    if math.isclose(ratio, scenario.n_batches, rel_tol=0.05):
        return bad("The losses are the per-epoch sum: divide by the number of batches "
                   "to get the mean loss per epoch.")
    if last_batch and len(reference) > 0 and all(
            math.isclose(v, r, rel_tol=REFERENCE_RTOL) for v, r in zip(values, last_batch,
                                                                      strict=True)) and any(
            not math.isclose(v, r, rel_tol=REFERENCE_RTOL)
            for v, r in zip(values, reference, strict=True)):
        pairs = ", ".join(f"{v:.6g} vs {r:.6g}" for v, r in zip(values, reference, strict=True))
        return [Problem.named(
            LAST_BATCH_LOSS, "Each epoch's entry in the loss history is its last batch's loss, "
            f"not the mean over its batches (yours vs the epoch means: {pairs}).", "One "
            "batch's loss is noisy and says little about the epoch: the history is meant to "
            "show how the loss over the whole data went down.", "add loss.item() for every "
            "batch to a total that starts at 0.0 each epoch, and append total / len(data).")]
    worst = max(abs(v - r) / r for v, r in zip(values, reference, strict=True))
    if worst > REFERENCE_RTOL and not other_problems:  # other mistakes explain it already
        pairs = ", ".join(f"{v:.6g} vs {r:.6g}" for v, r in zip(values, reference, strict=True))
        return [Problem.named(
            HISTORY_NOT_LIKE_RIGHT_RUN, f"The loss history differs from a right answer's on the "
            f"same data (yours vs right: {pairs}; up to {worst:.2%} apart, relatively, where "
            f"two right answers stay within {REFERENCE_RTOL:.2%}).", "The history is the mean "
            "of each epoch's batch losses, each taken from the float32 loss of an AMP forward "
            "pass: every batch counts once, also a shorter one and one whose step the scaler "
            "skipped. A loss or its targets in 16 bits, a mean over samples, or a fixed count "
            "of batches gives other numbers.", "let loss_fn compute the loss inside autocast "
            "(it runs in float32 there), add loss.item() for every batch, and divide by "
            "len(data).")]
    return []


@EXERCISE.checker
def check_train_with_amp(fn: TrainFn) -> CheckResult:
    """Run ``fn`` beside the reference answer on :data:`SCENARIOS` and the simulated devices;
    name every mistake.

    ``fn(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype, max_grad_norm=None)``
    must return the mean loss of each epoch. Takes a few seconds on a laptop CPU.
    """
    earlier: list[torch.amp.GradScaler] = []  # the scalers of the calls so far
    return check_on_devices(EXERCISE, SCENARIOS,
                            lambda scenario: _scenario_problems(fn, scenario, earlier),
                            lambda device_type: _simulated(fn, device_type),
                            differences={HISTORY_NOT_LIKE_RIGHT_RUN})


def _simulated(fn: TrainFn, device_type: str) -> list[Problem]:
    """``fn`` given ``device_type`` and fake batches on it, up to its first forward pass: does
    its autocast follow the device type and the dtype it is given?"""
    model, batches = make_exercise_problem(n_batches=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    with simulated_device(device_type, model) as seen:
        data = [tuple(torch.empty(t.shape, device=device_type) for t in batch)
                for batch in batches]
        attempt(fn, model, data, optimizer, nn.MSELoss(), EPOCHS, device_type, torch.float16)
    return simulated_problems(seen, torch.float16)


def _scenario_problems(fn: TrainFn, scenario: Scenario,
                       earlier: list[torch.amp.GradScaler]) -> list[Problem]:
    """The problems of one call; ``earlier`` holds the scalers of the calls before it."""
    spy, run, left = _run(fn, scenario)
    problems = _process_problems(spy, scenario, run) + left
    if any(scaler is seen for scaler in spy.scalers for seen in earlier):
        problems.append(Problem.named(
            SCALER_SHARED, "The same GradScaler object scaled the losses of separate calls of "
            "train_with_amp: it was made once, outside the function.", "Its scale and its count "
            "of good steps carry over from one training run to the next: after a run where "
            "float16 overflowed and the scale backed off, the next run starts from there, and "
            "a scale that collapsed to 6e-8 never lets the next run train.", "create the "
            "GradScaler inside train_with_amp, once, before the loops."))
    earlier.extend(spy.scalers)
    if run.error is None:
        reference = _reference(scenario, scaler_settings(spy))
        problems += _history_problems(run.value, reference, scenario, bool(problems),
                                      _last_batch_losses(scenario, scaler_settings(spy)))
    return problems
