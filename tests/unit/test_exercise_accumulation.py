"""check_train_accumulated: every listed mistake is named, and every correct variant passes.

``accumulated_loop()`` builds the reference answer's steps; each wrong case changes one thing, so
the checker must report that mistake's key and nothing else (RAISED too where GradScaler refuses
the call order). ``test_builder_defaults_are_the_reference_answer`` keeps the builder honest.
"""

from __future__ import annotations

import runpy
from collections.abc import Callable

import torch
from torch import nn

from amp_tutorial.exercises import accumulation as exercise
from amp_tutorial.exercises import checking, training_spy
from amp_tutorial.exercises.accumulation import check_train_accumulated, group_sizes
from tests.support import SOLUTIONS
from tests.support.exercises import (
    answers,
    assert_quoted,
    checker_tests,
    problem_keys,
    spy_mistakes,
    variant,
)

SOLUTION = SOLUTIONS / "train_accumulated.py"
reference_solution = runpy.run_path(str(SOLUTION))["train_accumulated"]


def group_means(group_losses: list[float], micro_losses: list[torch.Tensor]) -> object:
    """What the reference returns: per step, the sum of its micro-batches' divided losses."""
    return group_losses


def accumulated_loop(
    *,
    divide: str = "group",  # divide each loss by: "group" (its size), "k" (always), "all"
    # (the number of micro-batches) or "none"
    step_every: str = "group",  # "group" or "micro-batch"
    update: str = "group",  # "group" (after the step), "micro-batch" (also mid-group), "never"
    zero: str = "group start",  # "group start", "after step", "every micro-batch", "never"
    zero_on_model: bool = False,
    set_to_none: bool = True,
    unscale: str = "when clipping",  # "when clipping", "always" or "every micro-batch"
    clip: bool = True,
    clip_before_unscale: bool = False,
    clip_limit: Callable[[float | None, int], float | None] = lambda limit, size: limit,
    clip_only_fp16: bool = False,  # clip only when the scaler is enabled
    scaler_kind: str = "given",  # "given", "new per group", "none for bf16"
    last_group: str = "step",  # "step" or "skip"
    backward_each: bool = True,  # False: sum the group's losses, one backward per group
    autocast_on: bool = True,
    returns: Callable[[list[float], list[torch.Tensor]], object] = group_means,
) -> Callable[..., object]:
    """A ``train_accumulated`` doing the reference answer's steps, changed as the options say."""
    def train_accumulated(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps,
                          device_type, amp_dtype, max_grad_norm=None):
        k, n = accumulation_steps, len(micro_batches)
        if last_group == "skip":
            micro_batches = micro_batches[:n - n % k]
        owner = model if zero_on_model else optimizer
        use_scaler = not (scaler_kind == "none for bf16" and amp_dtype == torch.bfloat16)
        def backward(loss: torch.Tensor) -> None:
            (scaler.scale(loss) if use_scaler else loss).backward()

        def unscale_and_clip(size: int) -> None:
            limit = clip_limit(max_grad_norm, size)
            clipping = (clip and limit is not None
                        and not (clip_only_fp16 and amp_dtype != torch.float16))
            if clipping and clip_before_unscale:
                nn.utils.clip_grad_norm_(model.parameters(), limit)
            if use_scaler and (clipping or unscale == "always"):
                scaler.unscale_(optimizer)
            if clipping and not clip_before_unscale:
                nn.utils.clip_grad_norm_(model.parameters(), limit)

        group_losses, micro_losses = [], []
        for start in range(0, len(micro_batches), k):
            group = micro_batches[start:start + k]
            if scaler_kind == "new per group":
                scaler = torch.amp.GradScaler(device_type)
            if zero == "group start":
                owner.zero_grad(set_to_none=set_to_none)
            divisor = {"group": len(group), "k": k, "all": n, "none": 1}[divide]
            total, held = 0.0, []
            for j, (inputs, targets) in enumerate(group):
                if zero == "every micro-batch":
                    owner.zero_grad(set_to_none=set_to_none)
                with torch.autocast(device_type, dtype=amp_dtype, enabled=autocast_on):
                    loss = loss_fn(model(inputs), targets) / divisor
                total += loss.item()
                micro_losses.append(loss)
                if backward_each:
                    backward(loss)
                else:
                    held.append(loss)
                if unscale == "every micro-batch" and clip and max_grad_norm is not None:
                    unscale_and_clip(len(group))
                if step_every == "micro-batch" or j == len(group) - 1:
                    if held:
                        backward(sum(held))
                    if unscale != "every micro-batch":
                        unscale_and_clip(len(group))
                    if use_scaler:
                        scaler.step(optimizer)
                    else:
                        optimizer.step()
                    if use_scaler and update != "never":
                        scaler.update()
                    if zero == "after step":
                        owner.zero_grad(set_to_none=set_to_none)
                elif update == "micro-batch":
                    scaler.update()
            group_losses.append(total)
        return returns(group_losses, micro_losses)

    return train_accumulated


def test_builder_defaults_are_the_reference_answer() -> None:
    for scenario in exercise.SCENARIOS:
        runs = []
        for fn in (reference_solution, accumulated_loop()):
            model, micro_batches = exercise.make_micro_batches()
            optimizer = torch.optim.SGD(model.parameters(), lr=exercise.LEARNING_RATE)
            losses = fn(model, optimizer, scenario.new_scaler(), micro_batches, nn.MSELoss(),
                        exercise.ACCUMULATION, exercise.DEVICE_TYPE, scenario.amp_dtype,
                        scenario.max_grad_norm)
            runs.append((losses, [p.detach().clone() for p in model.parameters()]))
        (ref_losses, ref_params), (built_losses, built_params) = runs
        assert built_losses == ref_losses, scenario.name
        assert all(torch.equal(a, b) for a, b in zip(ref_params, built_params, strict=True))


STEP = "scaler.step(optimizer)  # once per group"
UNSCALE = "scaler.unscale_(optimizer)  # once, after the group's last backward\n"


# -- one mistake each ------------------------------------------------------------------------------
# (case, the one change, the key the checker must report, whether GradScaler also raises: it
# refuses update() with no step since the last one, a second step() without update(), and a second
# unscale_() before update(); the checker then reports the error too, as RAISED)
MISTAKES = [
    ("forward without autocast", accumulated_loop(autocast_on=False),
     exercise.FORWARD_NOT_AUTOCAST, False),
    ("loss not divided by k", accumulated_loop(divide="none"), exercise.LOSS_NOT_DIVIDED, False),
    ("short last group divided by k", accumulated_loop(divide="k"),
     exercise.REMAINDER_DIVIDED_BY_K, False),
    ("step every micro-batch", accumulated_loop(step_every="micro-batch", zero="after step"),
     exercise.STEPPED_MID_GROUP, False),
    ("update every micro-batch", accumulated_loop(update="micro-batch"),
     exercise.UPDATE_MID_GROUP, False),
    ("update never", accumulated_loop(update="never"), exercise.NO_SCALER_UPDATE, True),
    ("loss divided by the number of micro-batches", accumulated_loop(divide="all"),
     exercise.GRADIENT_NOT_LIKE_FP32, False),
    ("clip before unscale_", accumulated_loop(clip_before_unscale=True),
     exercise.CLIP_BEFORE_UNSCALE, False),
    # three the blind answer set found misnamed (update mid-group, a 99.9% gradient, a step mid-
    # group): each a one-line change of the reference answer
    ("optimizer.step() instead of scaler.step(optimizer)",
     variant(SOLUTION, "train_accumulated", (STEP, "optimizer.step()")),
     exercise.OPTIMIZER_STEP_DIRECT, False),
    ("clip without scaler.unscale_", variant(SOLUTION, "train_accumulated", (UNSCALE, "")),
     exercise.CLIP_WITHOUT_UNSCALE, False),
    ("scaler.step, then optimizer.step() too",
     variant(SOLUTION, "train_accumulated", (STEP, f"{STEP}\n        optimizer.step()")),
     exercise.STEPPED_TWICE, False),
    ("scaler.step twice",
     variant(SOLUTION, "train_accumulated", (STEP, f"{STEP}\n        {STEP}")),
     exercise.STEPPED_TWICE, True),
    ("zero_grad every micro-batch", accumulated_loop(zero="every micro-batch"),
     exercise.ZEROED_MID_GROUP, False),
    ("zero_grad every micro-batch, to zeros",
     accumulated_loop(zero="every micro-batch", set_to_none=False), exercise.ZEROED_MID_GROUP,
     False),
    ("zero_grad never", accumulated_loop(zero="never"), exercise.GRADS_NOT_ZEROED, False),
    ("unscale_ and clip every micro-batch", accumulated_loop(unscale="every micro-batch"),
     exercise.UNSCALED_MID_GROUP, True),
    ("clipping ignored", accumulated_loop(clip=False), exercise.NOT_CLIPPED, False),
    ("clipping only when the scaler is enabled (never in bfloat16)",
     accumulated_loop(clip_only_fp16=True), exercise.NOT_CLIPPED, False),
    ("max_grad_norm divided by the group's size",
     accumulated_loop(clip_limit=lambda limit, size: limit and limit / size),
     exercise.OVER_CLIPPED, False),
    ("clipping at 1.0 when max_grad_norm is None",
     accumulated_loop(clip_limit=lambda limit, size: 1.0 if limit is None else limit),
     exercise.CLIPPED_WITHOUT_MAX, False),
    ("scaler recreated per group", accumulated_loop(scaler_kind="new per group"),
     exercise.SCALER_REPLACED, False),
    ("short last group skipped", accumulated_loop(last_group="skip"),
     exercise.REMAINDER_SKIPPED, False),
    ("one step for all micro-batches",
     lambda *args, **kwargs: accumulated_loop()(*args[:5], len(args[3]), *args[6:], **kwargs),
     exercise.WRONG_GROUPS, False),
    ("losses summed, one backward per group", accumulated_loop(backward_each=False),
     exercise.GRAPHS_HELD, False),
    ("one loss per micro-batch",
     accumulated_loop(returns=lambda groups, micro: [x.item() for x in micro]),
     exercise.BAD_LOSSES, False),
    ("last micro-batch's loss per step",
     variant(SOLUTION, "train_accumulated", ("losses.append(group_loss)",
                                             "losses.append(loss.item() * len(group))")),
     exercise.BAD_LOSSES, False),
    ("the group's loss summed in a float16 tensor",
     variant(SOLUTION, "train_accumulated",
             ("group_loss = 0.0", "group_loss = torch.zeros((), dtype=torch.float16)"),
             ("group_loss += loss.item()", "group_loss += loss.detach().half()"),
             ("losses.append(group_loss)", "losses.append(group_loss.item())")),
     exercise.NOT_LIKE_REFERENCE, False),
    ("loss tensors", accumulated_loop(returns=lambda groups, micro: micro[2::3]),
     checking.WRONG_RETURN, False),
    ("returns None", accumulated_loop(returns=lambda groups, micro: None), checking.WRONG_RETURN,
     False),
    ("backward inside autocast",
     variant(SOLUTION, "train_accumulated",
             ("# the group's mean\n            scaler.scale(loss).backward()",
              "# the group's mean\n                scaler.scale(loss).backward()")),
     training_spy.BACKWARD_IN_AUTOCAST, False),
    *spy_mistakes(SOLUTION, "train_accumulated", 12),
]


def unscaled_then_direct_step(model, optimizer, scaler, micro_batches, loss_fn,
                              accumulation_steps, device_type, amp_dtype, max_grad_norm=None):
    """Blind answer W13: scaler.unscale_(optimizer), then optimizer.step() directly."""
    batches = list(micro_batches)
    losses = []
    for start in range(0, len(batches), accumulation_steps):
        group = batches[start:start + accumulation_steps]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for inputs, targets in group:
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets) / len(group)
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(optimizer)
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scaler.update()
        losses.append(total)
    return losses


MISTAKES += [("unscale_, then optimizer.step() directly (blind W13)", unscaled_then_direct_step,
              exercise.OPTIMIZER_STEP_DIRECT)]
WRONG = answers(MISTAKES)


def test_a_direct_step_after_unscale_is_told_apart() -> None:
    message = str(check_train_accumulated(unscaled_then_direct_step))
    assert "after scaler.unscale_(optimizer)" in message
    assert "AssertionError" not in message and "still multiplied" not in message


def test_torch_raises_what_the_messages_quote() -> None:
    """GradScaler's own words, quoted by three messages, for the call orders they name."""
    quoted = {"update every micro-batch": "No inf checks were recorded prior to update.",
              "update never": "step() has already been called since the last update().",
              "unscale_ and clip every micro-batch":
              "unscale_() has already been called on this optimizer since the last update()."}
    for case, words in quoted.items():
        assert_quoted(check_train_accumulated(WRONG[case]), words, case)


def test_blind_answer_set_misdiagnoses_are_named_right() -> None:
    """The three answers a blind set found named for a consequence: each now names its own
    mistake, and not the key it was reported as before."""
    for case, right, wrong in [
            ("optimizer.step() instead of scaler.step(optimizer)", exercise.OPTIMIZER_STEP_DIRECT,
             exercise.UPDATE_MID_GROUP),
            ("clip without scaler.unscale_", exercise.CLIP_WITHOUT_UNSCALE,
             exercise.GRADIENT_NOT_LIKE_FP32),
            ("scaler.step, then optimizer.step() too", exercise.STEPPED_TWICE,
             exercise.STEPPED_MID_GROUP),
            ("scaler.step twice", exercise.STEPPED_TWICE, exercise.STEPPED_MID_GROUP)]:
        result = check_train_accumulated(WRONG[case])
        assert right in result.keys and wrong not in result.keys, (case, str(result))
        assert exercise.NO_SCALER_UPDATE not in result.keys, (case, str(result))
    text = str(check_train_accumulated(WRONG["scaler.step, then optimizer.step() too"]))
    assert "scaler.step(optimizer), optimizer.step()" in text, text


def test_checker_leaves_torch_unpatched() -> None:
    backward, scale = torch.autograd.backward, torch.amp.GradScaler.scale
    unscale, step, update = (torch.amp.GradScaler.unscale_, torch.amp.GradScaler.step,
                             torch.amp.GradScaler.update)
    check_train_accumulated(WRONG["unscale_ and clip every micro-batch"])
    assert torch.autograd.backward is backward and torch.amp.GradScaler.scale is scale
    assert (torch.amp.GradScaler.unscale_, torch.amp.GradScaler.step,
            torch.amp.GradScaler.update) == (unscale, step, update)


# -- correct variants ------------------------------------------------------------------------------
def enumerate_loop(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps,
                   device_type, amp_dtype, max_grad_norm=None):
    """A right answer spelled differently: one loop over the micro-batches, a step when a group
    ends by count, zeroing after the step, bf16 without any scaler call."""
    k, n = accumulation_steps, len(micro_batches)
    fp16 = amp_dtype == torch.float16
    losses, running = [], 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        size = min(k, n - i // k * k)  # this micro-batch's group size
        with torch.amp.autocast(device_type, amp_dtype):
            loss = loss_fn(model(inputs), targets)
        (scaler.scale(loss / size) if fp16 else loss / size).backward()
        running += loss.item() / size
        if (i + 1) % k and i + 1 < n:
            continue
        if fp16:
            scaler.unscale_(optimizer)
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if fp16:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        for p in model.parameters():
            p.grad = None
        losses.append(running)
        running = 0.0
    return losses


def divided_after_unscale(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps,
                          device_type, amp_dtype, max_grad_norm=None):
    """A right answer that sums the micro-batch gradients and divides them by the group's size
    after unscale_, not the losses before backward."""
    losses = []
    for start in range(0, len(micro_batches), accumulation_steps):
        group = micro_batches[start:start + accumulation_steps]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for inputs, targets in group:
            with torch.autocast(device_type=device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(optimizer)
        for p in model.parameters():
            p.grad /= len(group)
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        losses.append(total / len(group))
    return losses


CORRECT = {
    "reference solution": reference_solution,
    "the scaled loss divided: (scaler.scale(loss) / len(group)).backward()": variant(
        SOLUTION, "train_accumulated",
        ("loss = loss_fn(model(inputs), targets) / len(group)",
         "loss = loss_fn(model(inputs), targets)"),
        ("scaler.scale(loss).backward()", "(scaler.scale(loss) / len(group)).backward()"),
        ("group_loss += loss.item()", "group_loss += loss.item() / len(group)")),
    "the gradients divided after unscale_": divided_after_unscale,
    "one loop, step by count, grads set to None by hand, bf16 without scaler calls":
        enumerate_loop,
    "zero after the step (to zeros), model.zero_grad, unscale_ every group": accumulated_loop(
        zero="after step", zero_on_model=True, set_to_none=False, unscale="always"),
    "bf16 without a scaler, losses as a tuple": accumulated_loop(
        scaler_kind="none for bf16", returns=lambda groups, micro: tuple(groups)),
}


test_each_mistake_is_named, test_every_problem_key_has_a_case, test_correct_answers_pass = (
    checker_tests(check_train_accumulated, MISTAKES,
                  problem_keys(exercise, exercise.DEVICE_TYPE, exercise.PRAISE,
                               exercise.LOSSES_FIX),
                  CORRECT, exercise.PRAISE))


def test_the_contract_has_a_short_last_group() -> None:
    assert group_sizes(exercise.N_MICRO, exercise.ACCUMULATION) == [3, 3, 2]
    assert group_sizes(6, 3) == [3, 3]


def test_problem_is_repeatable_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    (model_a, data_a), (model_b, data_b) = (exercise.make_micro_batches() for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(),
                                                   strict=True))
    assert len(data_a) == exercise.N_MICRO and torch.equal(data_a[0][0], data_b[0][0])
