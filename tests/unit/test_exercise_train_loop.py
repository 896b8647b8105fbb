"""check_train_with_amp: every listed mistake is named, and every correct variant passes.

``amp_loop()`` builds the reference loop; each wrong case changes exactly one thing in it, so the
checker must report that mistake's key and nothing else. The checker watches what the code does at
run time (autocast state, backward, GradScaler and optimizer calls, the returned history), so a
built loop and a hand-written one with the same steps look the same to it;
``test_builder_defaults_are_the_reference_loop`` keeps the builder honest about that.
"""

from __future__ import annotations

import runpy
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import pytest
import torch
from torch import nn

from amp_tutorial.exercises import checking, training_spy
from amp_tutorial.exercises import train_loop as exercise
from amp_tutorial.exercises.train_loop import check_train_with_amp
from tests.support import SOLUTIONS
from tests.support.exercises import answers, checker_tests, problem_keys, spy_mistakes, variant

SOLUTION = SOLUTIONS / "train_with_amp.py"
reference_solution = runpy.run_path(str(SOLUTION))["train_with_amp"]


# -- the loop builder ------------------------------------------------------------------------------
def epoch_means(values: list[float], n_batches: int) -> list[float]:
    """The mean of each run of ``n_batches`` values: one per epoch."""
    return [sum(values[i:i + n_batches]) / n_batches for i in range(0, len(values), n_batches)]


def mean_loss_per_epoch(losses: list[torch.Tensor], scaled: list[float], n_batches: int) -> object:
    """What the reference returns: the mean of ``loss.item()`` over each epoch's batches."""
    return epoch_means([loss.item() for loss in losses], n_batches)


def amp_loop(
    *,
    scaler: str = "fp16",  # "fp16" (enabled for float16), "off", "always" or "none for bf16"
    enabled_toggles: bool = False,  # pass enabled= to autocast, as code with a use_amp flag does
    autocast: Callable[..., AbstractContextManager] = torch.autocast,
    scaler_per: str = "run",  # create the scaler once per "run", per "epoch" or per "step"
    zero_grad: str = "each step",  # "each step" (before forward), "after step", "once",
    # "after backward" (right after it, before unscale_) or "before step" (after clipping)
    zero_grad_on_model: bool = False,
    set_to_none: bool | None = True,  # None: zero_grad() with its default
    forward_in_autocast: bool = True,
    loss_in_autocast: bool = True,
    backward_in_autocast: bool = False,
    scale_loss: bool = True,
    backward: bool = True,
    unscale_every_step: bool = False,  # unscale_ also when there is no clipping
    clip: bool = True,
    clip_before_unscale: bool = False,
    clip_limit: Callable[[float | None], float | None] = lambda limit: limit,
    clip_value_too: bool = False,  # a no-op clip_grad_value_ after unscale_, before the norm clip
    step: bool = True,
    step_via_scaler: bool = True,
    call_update: bool = True,
    extra_step: str | None = None,  # step again: "scaler" (scaler.step twice), "optimizer"
    # (optimizer.step() after scaler.step) or "after update" (step, update, step, update)
    history: Callable[[list[torch.Tensor], list[float], int], object] = mean_loss_per_epoch,
) -> Callable[..., object]:
    """A ``train_with_amp`` doing the reference solution's steps, changed as the options say.

    With the defaults it is the reference loop. ``history(losses, scaled_losses, n_batches)`` makes
    the return value from every step's loss tensor and ``scaled_loss.item()``.
    """
    def zero(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        owner = model if zero_grad_on_model else optimizer
        if set_to_none is None:
            owner.zero_grad()
        else:
            owner.zero_grad(set_to_none=set_to_none)

    def make_scaler(device_type: str, amp_dtype: torch.dtype) -> torch.amp.GradScaler | None:
        fp16 = amp_dtype == torch.float16
        if scaler == "none for bf16":
            return torch.amp.GradScaler(device_type) if fp16 else None
        if scaler == "always":  # on for bfloat16 too; small scale and growth interval to move it
            return torch.amp.GradScaler(device_type, init_scale=2.0**10, growth_interval=3)
        if scaler == "off":
            return torch.amp.GradScaler(device_type, enabled=False)
        assert scaler == "fp16", scaler
        return torch.amp.GradScaler(device_type, enabled=fp16)

    def train_with_amp(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                       max_grad_norm=None):
        grad_scaler = make_scaler(device_type, amp_dtype)
        use_scaler = grad_scaler is not None
        max_grad_norm = clip_limit(max_grad_norm)
        clipping = clip and max_grad_norm is not None
        unscale_now = use_scaler and (clipping or unscale_every_step)

        def amp(on: bool) -> AbstractContextManager:
            if not on:
                return nullcontext()
            if enabled_toggles:
                return autocast(device_type, dtype=amp_dtype, enabled=True)
            return autocast(device_type=device_type, dtype=amp_dtype)

        losses, scaled_losses = [], []
        if zero_grad == "once":
            zero(model, optimizer)
        for _ in range(epochs):
            if scaler_per == "epoch":
                grad_scaler = make_scaler(device_type, amp_dtype)
            for inputs, targets in data:
                if scaler_per == "step":
                    grad_scaler = make_scaler(device_type, amp_dtype)
                if zero_grad == "each step":
                    zero(model, optimizer)
                with amp(forward_in_autocast):
                    outputs = model(inputs)
                with amp(forward_in_autocast and loss_in_autocast):
                    loss = loss_fn(outputs, targets)
                with amp(backward_in_autocast):
                    scaled = grad_scaler.scale(loss) if use_scaler and scale_loss else loss
                    if backward:
                        scaled.backward()
                if zero_grad == "after backward":
                    zero(model, optimizer)
                if unscale_now and not clip_before_unscale:
                    grad_scaler.unscale_(optimizer)
                if clipping:
                    if clip_value_too:
                        nn.utils.clip_grad_value_(model.parameters(), 1e9)
                    nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                if unscale_now and clip_before_unscale:
                    grad_scaler.unscale_(optimizer)
                if zero_grad == "before step":
                    zero(model, optimizer)
                if step and use_scaler and step_via_scaler:
                    grad_scaler.step(optimizer)
                elif step:
                    optimizer.step()
                if extra_step == "scaler":
                    grad_scaler.step(optimizer)
                elif extra_step == "optimizer":
                    optimizer.step()
                if use_scaler and call_update:
                    grad_scaler.update()
                if extra_step == "after update":
                    grad_scaler.step(optimizer)
                    grad_scaler.update()
                if zero_grad == "after step":
                    zero(model, optimizer)
                losses.append(loss)
                scaled_losses.append(scaled.item())
        return history(losses, scaled_losses, len(data))

    return train_with_amp


def test_builder_defaults_are_the_reference_loop() -> None:
    for scenario in exercise.SCENARIOS:
        runs = []
        for fn in (reference_solution, amp_loop()):
            model, data = exercise.make_exercise_problem()
            optimizer = torch.optim.Adam(model.parameters(), lr=exercise.LEARNING_RATE)
            history = fn(model, data, optimizer, nn.MSELoss(), exercise.EPOCHS,
                         exercise.DEVICE_TYPE, scenario.amp_dtype, scenario.max_grad_norm)
            runs.append((history, [p.detach().clone() for p in model.parameters()]))
        (ref_history, ref_params), (built_history, built_params) = runs
        assert built_history == pytest.approx(ref_history, rel=1e-12, abs=0), scenario.name
        assert all(torch.equal(a, b) for a, b in zip(ref_params, built_params, strict=True))


# -- one mistake each ------------------------------------------------------------------------------
# (case, the one change to the reference loop, the key the checker must report, whether GradScaler
# also raises a RuntimeError, a second step() without update() say, which the checker then reports
# too, as RAISED; its internal checks (AssertionError: step() without scale(), no gradients to
# unscale) are quoted in the mistake's own message instead)
MISTAKES = [
    ("loss not scaled", amp_loop(scale_loss=False), exercise.LOSS_NOT_SCALED, False),
    ("scaler disabled in fp16", amp_loop(scaler="off"), exercise.LOSS_NOT_SCALED, False),
    ("optimizer.step direct", amp_loop(step_via_scaler=False, unscale_every_step=True),
     exercise.OPTIMIZER_STEP_DIRECT, False),
    ("no scaler.update", amp_loop(call_update=False), exercise.NO_SCALER_UPDATE, True),
    ("new scaler every step", amp_loop(scaler_per="step"), exercise.SCALER_NOT_CARRIED, False),
    ("new scaler every epoch", amp_loop(scaler_per="epoch"), exercise.SCALER_NOT_CARRIED,
     False),
    ("scaler.step twice", amp_loop(extra_step="scaler"), exercise.STEPPED_TWICE, True),
    ("optimizer.step after scaler.step", amp_loop(extra_step="optimizer"),
     exercise.STEPPED_TWICE, False),
    ("step and update twice", amp_loop(extra_step="after update"), exercise.STEPPED_TWICE,
     False),
    ("zeroed between backward and step", amp_loop(zero_grad="before step"),
     exercise.GRADS_ZEROED_BEFORE_STEP, False),
    ("zeroed (to zeros) between backward and step",
     amp_loop(zero_grad="before step", set_to_none=False), exercise.GRADS_ZEROED_BEFORE_STEP,
     False),
    ("model zeroed right after backward, before unscale_",
     amp_loop(zero_grad="after backward", zero_grad_on_model=True),
     exercise.GRADS_ZEROED_BEFORE_STEP, False),
    ("grads zeroed once, not every step", amp_loop(zero_grad="once"), exercise.GRADS_NOT_ZEROED,
     False),
    ("forward not autocast", amp_loop(forward_in_autocast=False), exercise.FORWARD_NOT_AUTOCAST,
     False),
    ("backward in autocast", amp_loop(backward_in_autocast=True),
     training_spy.BACKWARD_IN_AUTOCAST, False),
    *spy_mistakes(SOLUTION, "train_with_amp", 16),
    ('autocast for "cuda" or else "cpu"',
     variant(SOLUTION, "train_with_amp", ("autocast(device_type=device_type",
                                          'autocast(device_type="cuda" if device_type == "cuda" '
                                          'else "cpu"')),
     training_spy.AUTOCAST_OTHER_DEVICE, False),

    ("clip before unscale_", amp_loop(clip_before_unscale=True), exercise.CLIP_BEFORE_UNSCALE,
     False),
    ("clipping ignored", amp_loop(clip=False), exercise.NOT_CLIPPED, False),
    ("max_grad_norm halved", amp_loop(clip_limit=lambda limit: limit and limit / 2),
     exercise.OVER_CLIPPED, False),
    ("clipping at 1.0 when max_grad_norm is None",
     amp_loop(clip_limit=lambda limit: 1.0 if limit is None else limit),
     exercise.CLIPPED_WITHOUT_MAX, False),
    ("no backward", amp_loop(backward=False), exercise.NO_BACKWARD, True),
    ("no optimizer step", amp_loop(step=False), exercise.NO_OPTIMIZER_STEP, True),
    ("returns None", amp_loop(history=lambda losses, scaled, n: None), exercise.BAD_HISTORY,
     False),
    ("history of tensors", amp_loop(history=lambda losses, scaled, n: losses[::n]),
     exercise.BAD_HISTORY, False),
    ("one loss per step", amp_loop(history=lambda losses, scaled, n: [x.item() for x in losses]),
     exercise.BAD_HISTORY, False),
    ("scaled losses", amp_loop(history=lambda losses, scaled, n: epoch_means(scaled, n)),
     exercise.BAD_HISTORY, False),
    ("last batch, not mean",
     amp_loop(history=lambda losses, scaled, n: [x.item() for x in losses[n - 1::n]]),
     exercise.LAST_BATCH_LOSS, False),
    ("each epoch's mean without its first batch",
     amp_loop(history=lambda losses, scaled, n: [
         sum(x.item() for x in losses[start + 1:start + n]) / (n - 1)
         for start in range(0, len(losses), n)]),
     exercise.HISTORY_NOT_LIKE_RIGHT_RUN, False),
]
MISTAKES.append(("one GradScaler for every call (a module-level global)",
                 variant(SOLUTION, "train_with_amp",
                         ("import torch\n",
                          'import torch\n\nscaler = torch.amp.GradScaler("cpu")\n'),
                         ("    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == "
                          "torch.float16)\n", "")),
                 exercise.SCALER_SHARED, False))


def last_batch_loss(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                    max_grad_norm=None):
    """Blind answer W09: each epoch's entry is its last batch's loss, not the mean."""
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        for inputs, targets in data:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        history.append(loss.item())
    return history


MISTAKES.append(("the last batch's loss per epoch, not the mean (blind W09)", last_batch_loss,
                 exercise.LAST_BATCH_LOSS))
WRONG = answers(MISTAKES)


def test_a_last_batch_history_is_named_as_such() -> None:
    message = str(check_train_with_amp(last_batch_loss))
    assert "its last batch's loss, not the mean over its batches" in message
    assert "inside autocast" not in message


def test_report_is_plain_words() -> None:
    result = check_train_with_amp(WRONG["loss not scaled"])
    text = str(result)
    assert "unscaled loss" in text and "float16" in text and "Traceback" not in text
    assert "scaler.scale(loss).backward()" in result.problems[0].message  # shown when named again


def test_checker_leaves_torch_unpatched() -> None:
    backward, scale = torch.autograd.backward, torch.amp.GradScaler.scale
    check_train_with_amp(WRONG["clip before unscale_"])
    assert torch.autograd.backward is backward and torch.amp.GradScaler.scale is scale


# -- correct variants ------------------------------------------------------------------------------
def hand_written_loop(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                      max_grad_norm=None):
    """A right loop written differently from the builder: manual zeroing, an `if` per scaler."""
    scaler = torch.amp.GradScaler(device_type) if amp_dtype == torch.float16 else None
    history = []
    for _ in range(epochs):
        losses = []
        for inputs, targets in data:
            with torch.autocast(device_type, amp_dtype):
                loss = loss_fn(model(inputs), targets)
            if scaler is None:
                loss.backward()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            if max_grad_norm:
                nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            for p in model.parameters():
                p.grad = None
            losses.append(loss.item())
        history.append(sum(losses) / len(losses))
    return history


CORRECT = {
    "reference solution": reference_solution,
    "bf16 without a scaler": amp_loop(scaler="none for bf16"),
    # also: the loss outside autocast, zeroing after the step, unscale_ even without clipping
    "enabled= toggles, torch.amp.autocast, set_to_none=False": amp_loop(
        enabled_toggles=True, autocast=torch.amp.autocast, loss_in_autocast=False,
        set_to_none=False, zero_grad="after step", unscale_every_step=True),
    "scaler on for bf16 too, model.zero_grad(), clip_grad_value_ after unscale_": amp_loop(
        scaler="always", zero_grad_on_model=True, set_to_none=None, clip_value_too=True),
    "zero_grad() with its default at the bottom of the loop": amp_loop(
        zero_grad="after step", set_to_none=None),
    "model.zero_grad(set_to_none=False) at the top, bf16 without a scaler": amp_loop(
        zero_grad_on_model=True, set_to_none=False, scaler="none for bf16"),
    "hand-written: grads set to None by hand, scaler calls spelled out": hand_written_loop,
}


test_each_mistake_is_named, test_every_problem_key_has_a_case, test_correct_answers_pass = (
    checker_tests(check_train_with_amp, MISTAKES,
                  problem_keys(exercise, exercise.DEVICE_TYPE, exercise.PRAISE),
                  CORRECT, exercise.PRAISE))


def test_fp32_reference_learns() -> None:
    model, data = exercise.make_exercise_problem()
    optimizer = torch.optim.Adam(model.parameters(), lr=exercise.LEARNING_RATE)
    history = exercise.train_fp32(model, data, optimizer, torch.nn.MSELoss(), exercise.EPOCHS)
    assert len(history) == exercise.EPOCHS and history[-1] < history[0]


def test_problem_is_repeatable_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    (model_a, data_a), (model_b, data_b) = (exercise.make_exercise_problem() for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(),
                                                   strict=True))
    assert torch.equal(data_a[0][0], data_b[0][0])


def test_zeroed_before_step_message_quotes_what_torch_raises() -> None:
    """set_to_none=True: scaler.step trips GradScaler's internal check; the mistake's message
    quotes torch's words for it, and the check itself is no finding of its own."""
    result = check_train_with_amp(WRONG["zeroed between backward and step"])
    assert checking.RAISED not in result.keys, str(result)
    said = next(p.message for p in result.problems
                if p.key == exercise.GRADS_ZEROED_BEFORE_STEP)
    assert "No inf checks were recorded for this optimizer." in said
    silent = check_train_with_amp(WRONG["zeroed (to zeros) between backward and step"])
    assert checking.RAISED not in silent.keys  # set_to_none=False: no error, a silent step


UNSCALE = (" " * 16 + "scaler.unscale_(optimizer)  # clip the true gradients, not the scaled "
           "ones\n")
# Two mistakes: a clip on the still-scaled gradients (no unscale_ at all) and optimizer.step() in
# place of scaler.step, so scaler.update() then trips GradScaler's internal check ("No inf checks
# were recorded prior to update.")
clip_scaled_then_step_directly = variant(
    SOLUTION, "train_with_amp", (UNSCALE, ""),
    ("scaler.step(optimizer)  # skips", "optimizer.step()  # skips"))
# Issue 61's held-out answer: the clip sits under `if scaler.is_enabled()`, so a bfloat16 run
# with max_grad_norm is never clipped
clip_only_with_a_scaler = variant(
    SOLUTION, "train_with_amp",
    ("if max_grad_norm is not None:", "if scaler.is_enabled() and max_grad_norm is not None:"))


def test_every_mistake_is_named_and_torch_s_internal_check_is_not_a_finding() -> None:
    result = check_train_with_amp(clip_scaled_then_step_directly)
    assert result.keys == {exercise.OPTIMIZER_STEP_DIRECT, exercise.CLIP_BEFORE_UNSCALE}, result
    direct = next(p for p in result.problems if p.key == exercise.OPTIMIZER_STEP_DIRECT)
    # torch's words appear once, where the mistake that causes them is explained
    assert "No inf checks were recorded prior to update." in result.shown(direct)
    assert str(result).count("No inf checks were recorded") == 1, str(result)


def test_a_mistake_named_again_says_what_to_write_instead() -> None:
    """As the other checkers do: the fix is shown from the second check naming the same mistake,
    so a first answer is thought about before it is pasted."""
    first = check_train_with_amp(clip_scaled_then_step_directly)
    second = check_train_with_amp(clip_scaled_then_step_directly)
    assert first.keys == second.keys
    assert checking.FIX not in str(first)
    assert all(checking.FIX in second.shown(p) for p in second.problems), str(second)
    assert checking.NAMED_AGAIN in str(first)


def test_a_clip_kept_for_float16_alone_is_named_in_a_bfloat16_run() -> None:
    result = check_train_with_amp(clip_only_with_a_scaler)
    assert result.keys == {exercise.NOT_CLIPPED}, str(result)
    assert "bfloat16 + clipping" in str(result)
