"""check_fp16_step: every listed mistake is named, and every correct variant passes.

``amp_step()`` builds the reference step; each wrong case changes exactly one thing in it, so the
checker must report that mistake's key and nothing else (RAISED may come with it where GradScaler
refuses the call order). The checker watches what the code does at run time, so a built step and a
hand-written one with the same calls look the same to it;
``test_builder_defaults_are_the_reference_step`` keeps the builder honest about that.
"""

from __future__ import annotations

import runpy
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import pytest
import torch
from torch import nn

from amp_tutorial.exercises import checking, training_spy
from amp_tutorial.exercises import fp16_step as exercise
from amp_tutorial.exercises.fp16_step import check_fp16_step
from tests.support import SOLUTIONS
from tests.support.exercises import (
    answers,
    assert_quoted,
    checker_tests,
    problem_keys,
    variant,
)

reference_solution = runpy.run_path(str(SOLUTIONS / "fp16_step.py"))["fp16_step"]


# -- the step builder ------------------------------------------------------------------------------
def amp_step(
    *,
    zero_grad: str = "start",  # "start", "never", or "after backward" (before unscale_)
    zero_on_model: bool = False,
    set_to_none: bool | None = True,  # None: zero_grad() with its default
    autocast: Callable[..., AbstractContextManager] = torch.autocast,
    autocast_dtype: bool = True,  # False: no dtype= (the device type's default)
    forward_in_autocast: bool = True,
    loss_in_autocast: bool = True,
    backward_in_autocast: bool = False,
    backward: str = "scaled",  # "scaled", "autograd" (torch.autograd.backward(scaled)),
    # "unscaled" (loss.backward(), no scale() at all) or "scaled, loss" (scale() discarded)
    unscale: str = "before clip",  # "before clip", "after clip", "never" or "twice"
    clip: str = "model",  # "model" (model.parameters()), "groups" (optimizer.param_groups),
    # "L1" (norm_type=1), "none", "no min" (by hand: grad * max_norm / norm, without min(1, .))
    device_type: str | None = None,  # None: inputs.device.type; else this one, hard-coded
    dtype_by_device: bool = False,  # float16 on "cpu" and "cuda", bfloat16 on any other device
    step: str = "scaler",  # "scaler", "optimizer" (optimizer.step() only) or "both"
    update: str = "always",  # "always", "never", "pinned" (update(scale before the step)) or
    # "if finite" (step and update only when the clipped norm is finite)
    own_scaler: bool = False,  # a new GradScaler inside the step, not the one passed in
    returns: str = "item",  # "item", "float", "scaled", "tensor", "none" or "grad norm"
) -> Callable[..., object]:
    """An ``fp16_step`` doing the reference solution's calls, changed as the options say."""
    device_type_given = device_type
    def zero(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        owner = model if zero_on_model else optimizer
        if set_to_none is None:
            owner.zero_grad()
        else:
            owner.zero_grad(set_to_none=set_to_none)

    def amp(on: bool, device_type: str) -> AbstractContextManager:
        if not on:
            return nullcontext()
        if dtype_by_device:
            dtype = torch.float16 if device_type in ("cpu", "cuda") else torch.bfloat16
            return autocast(device_type=device_type, dtype=dtype)
        if autocast_dtype:
            return autocast(device_type=device_type, dtype=torch.float16)
        return autocast(device_type=device_type)

    def fp16_step(model, optimizer, scaler, inputs, targets, loss_fn, max_norm):
        device_type = inputs.device.type if device_type_given is None else device_type_given
        if own_scaler:
            scaler = torch.amp.GradScaler(device_type)
        if zero_grad == "start":
            zero(model, optimizer)
        with amp(forward_in_autocast, device_type):
            outputs = model(inputs)
        with amp(forward_in_autocast and loss_in_autocast, device_type):
            loss = loss_fn(outputs, targets)
        with amp(backward_in_autocast, device_type):
            scaled = scaler.scale(loss) if backward != "unscaled" else loss
            if backward == "autograd":
                torch.autograd.backward(scaled)
            elif backward == "scaled":
                scaled.backward()
            else:
                loss.backward()
        if zero_grad == "after backward":
            zero(model, optimizer)
        for _ in range({"before clip": 1, "twice": 2}.get(unscale, 0)):
            scaler.unscale_(optimizer)
        params = ([p for group in optimizer.param_groups for p in group["params"]]
                  if clip == "groups" else model.parameters())
        norm = torch.tensor(0.0)
        if clip == "no min":
            grads = [p.grad for p in params]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                         for g in grads]))
            for g in grads:
                g.mul_(max_norm / norm)
        elif clip != "none":
            norm = nn.utils.clip_grad_norm_(params, max_norm, norm_type=1 if clip == "L1" else 2)
        if unscale == "after clip":
            scaler.unscale_(optimizer)
        scale = scaler.get_scale()
        if update != "if finite" or torch.isfinite(norm):
            if step in ("scaler", "both"):
                scaler.step(optimizer)
            if step in ("optimizer", "both"):
                optimizer.step()
            if update in ("always", "if finite"):
                scaler.update()
            elif update == "pinned":
                scaler.update(scale)
        return {"item": loss.item(), "float": float(loss.detach()), "scaled": scaled.item(),
                "tensor": loss, "none": None, "grad norm": norm.item()}[returns]

    return fp16_step


def test_builder_defaults_are_the_reference_step() -> None:
    for scenario in exercise.SCENARIOS:
        runs = []
        for fn in (reference_solution, amp_step()):
            model, data = scenario.problem()
            optimizer = exercise._optimizer(scenario, model)
            scaler = torch.amp.GradScaler("cpu", init_scale=scenario.init_scale)
            losses = [fn(model, optimizer, scaler, inputs, targets, nn.MSELoss(),
                         scenario.max_grad_norm) for inputs, targets in data[:scenario.steps]]
            runs.append((losses, exercise._params(model), scaler.get_scale()))
        assert runs[0][0] == runs[1][0] and runs[0][2] == runs[1][2], scenario.name
        assert torch.equal(runs[0][1], runs[1][1]), scenario.name


# -- one mistake each ------------------------------------------------------------------------------
# (case, the one change to the reference step, the key the checker must report, whether GradScaler
# also raises; the checker then reports the error too, as RAISED)
MISTAKES = [
    ("targets rounded to float16",
     variant(SOLUTIONS / "fp16_step.py", "fp16_step",
             ("loss = loss_fn(model(inputs), targets)",
              "loss = loss_fn(model(inputs), targets.half())")),
     exercise.NOT_LIKE_REFERENCE, False),
    ("clip before unscale_", amp_step(unscale="after clip"), exercise.CLIP_BEFORE_UNSCALE,
     False),
    ("no unscale_: clip on scaled gradients", amp_step(unscale="never"),
     exercise.CLIP_WITHOUT_UNSCALE, False),
    ("no clipping", amp_step(clip="none"), exercise.NOT_CLIPPED, False),
    ("optimizer.step() directly", amp_step(step="optimizer"), exercise.OPTIMIZER_STEP_DIRECT,
     False),
    ("scaler.step, then optimizer.step() too", amp_step(step="both"), exercise.STEPPED_TWICE,
     False),
    ("no scaler.update()", amp_step(update="never"), exercise.NO_SCALER_UPDATE, True),
    ("backward inside autocast", amp_step(backward_in_autocast=True),
     training_spy.BACKWARD_IN_AUTOCAST, False),
    ("clip by hand without min(1, max_norm / norm)", amp_step(clip="no min"),
     training_spy.CLIPPED_UP, False),
    ('autocast with a hard-coded "cpu"', amp_step(device_type="cpu"),
     training_spy.AUTOCAST_OTHER_DEVICE, False),
    ("bfloat16 on devices other than cpu and cuda", amp_step(dtype_by_device=True),
     training_spy.DTYPE_BY_DEVICE, False),
    ("loss not scaled", amp_step(backward="unscaled"), exercise.LOSS_NOT_SCALED, False),
    ("scaled loss made, backward on the loss", amp_step(backward="scaled, loss"),
     exercise.LOSS_NOT_SCALED, False),
    ("unscale_ twice", amp_step(unscale="twice"), exercise.UNSCALED_TWICE, True),
    ("zero_grad between backward and step", amp_step(zero_grad="after backward"),
     exercise.GRADS_ZEROED_BEFORE_STEP, False),
    ("zero_grad(set_to_none=False) between backward and step",
     amp_step(zero_grad="after backward", set_to_none=False), exercise.GRADS_ZEROED_BEFORE_STEP,
     False),
    ("no zero_grad", amp_step(zero_grad="never"), exercise.GRADS_NOT_ZEROED, False),
    ("forward without autocast", amp_step(forward_in_autocast=False),
     exercise.FORWARD_NOT_AUTOCAST, False),
    ("autocast without dtype (bfloat16 on a CPU)", amp_step(autocast_dtype=False),
     exercise.WRONG_AUTOCAST_DTYPE, False),
    ("a new GradScaler inside the step", amp_step(own_scaler=True), exercise.OTHER_SCALER,
     False),
    ("returns the scaled loss", amp_step(returns="scaled"), exercise.RETURNED_SCALED_LOSS,
     False),
    ("returns the loss tensor", amp_step(returns="tensor"), checking.WRONG_RETURN, False),
    ("returns None", amp_step(returns="none"), checking.WRONG_RETURN, False),
    ("returns the gradient norm", amp_step(returns="grad norm"), exercise.LOSS_NOT_LIKE_FP32,
     False),
    ("clips the L1 norm", amp_step(clip="L1"), exercise.PARAMS_NOT_LIKE_FP32, False),
    ("step and update skipped on a non-finite norm", amp_step(update="if finite"),
     exercise.OVERFLOW_NOT_HANDLED, False),
    ("update(new_scale) keeps the scale", amp_step(update="pinned"),
     exercise.OVERFLOW_NOT_HANDLED, False),
]


def update_before_step(model, optimizer, scaler, inputs, targets, loss_fn, max_norm):
    """Blind answer W10: scaler.update() before scaler.step(optimizer)."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(inputs.device.type, dtype=torch.float16):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    scaler.step(optimizer)
    return loss.item()


MISTAKES += [("scaler.update() before scaler.step() (blind W10)", update_before_step,
              exercise.UPDATE_BEFORE_STEP, True)]
WRONG = answers(MISTAKES)


def test_update_before_step_explains_torchs_error() -> None:
    message = str(check_fp16_step(update_before_step))
    assert "scaler.update() ran before scaler.step(optimizer)" in message
    assert "unscale_() is being called after step()" in message


def test_a_spent_budget_is_reported_as_the_checks_time(monkeypatch) -> None:
    """Blind answer B3: the limit that stopped the last call was the rest of the check's budget,
    not the per-call limit; the message says the budget, not '2 seconds'."""
    def slow(*args):
        import time
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
        return reference_solution(*args)

    monkeypatch.setattr(checking, "CHECK_BUDGET_S", 1.0)
    message = str(check_fp16_step(slow))
    assert f"used up the {checking.CHECK_BUDGET_S:g} seconds" in message, message


def test_report_is_plain_words() -> None:
    text = str(check_fp16_step(WRONG["no unscale_: clip on scaled gradients"]))
    assert "scaler.unscale_(optimizer)" in text and "Traceback" not in text


def test_messages_quote_what_torch_raises() -> None:
    """Where GradScaler refuses the call order, the message quotes torch's own words."""
    for case, words in [("unscale_ twice", "unscale_() has already been called on this "
                                            "optimizer since the last update()."),
                        ("no scaler.update()", "unscale_() is being called after step()."),
                        ("zero_grad between backward and step",
                         "No inf checks were recorded for this optimizer."),
                        ("loss not scaled", "Attempted unscale_ but _scale is None.")]:
        assert_quoted(check_fp16_step(WRONG[case]), words, case)


def test_checker_leaves_torch_unpatched() -> None:
    patched = (torch.autograd.backward, torch.amp.GradScaler.scale, torch.amp.GradScaler.unscale_,
               torch.amp.GradScaler.step, torch.amp.GradScaler.update)
    check_fp16_step(WRONG["unscale_ twice"])
    assert patched == (torch.autograd.backward, torch.amp.GradScaler.scale,
                       torch.amp.GradScaler.unscale_, torch.amp.GradScaler.step,
                       torch.amp.GradScaler.update)


# -- correct variants ------------------------------------------------------------------------------
def hand_written_step(model, optimizer, scaler, inputs, targets, loss_fn, max_norm):
    """A right step written differently: gradients set to None by hand, positional autocast
    arguments, the loss detached before .item()."""
    for p in model.parameters():
        p.grad = None
    with torch.autocast(inputs.device.type, torch.float16):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(list(model.parameters()), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().item()


CORRECT = {
    "reference solution": reference_solution,
    "set_to_none=False, torch.autograd.backward, clip via param_groups": amp_step(
        set_to_none=False, backward="autograd", clip="groups"),
    "torch.amp.autocast, the loss outside autocast, float(loss.detach())": amp_step(
        autocast=torch.amp.autocast, loss_in_autocast=False, returns="float"),
    "model.zero_grad() with its default": amp_step(zero_on_model=True, set_to_none=None),
    "hand-written: grads set to None by hand, positional autocast": hand_written_step,
}


test_each_mistake_is_named, test_every_problem_key_has_a_case, test_correct_answers_pass = (
    checker_tests(check_fp16_step, MISTAKES,
                  problem_keys(exercise, exercise.DEVICE_TYPE, exercise.PRAISE),
                  CORRECT, exercise.PRAISE))


# -- the problem itself ----------------------------------------------------------------------------
def reference_run(scenario: exercise.Scenario) -> tuple[list[float], torch.Tensor, float, int]:
    """The reference step on ``scenario``: losses, parameters' change, final scale, and how many
    optimizer steps ran."""
    model, data = scenario.problem()
    initial = exercise._params(model)
    optimizer = exercise._optimizer(scenario, model)
    stepped = []
    optimizer.register_step_post_hook(lambda *args: stepped.append(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=scenario.init_scale)
    losses = [reference_solution(model, optimizer, scaler, inputs, targets, nn.MSELoss(),
                                 scenario.max_grad_norm)
              for inputs, targets in data[:scenario.steps]]
    return losses, exercise._params(model) - initial, scaler.get_scale(), len(stepped)


@pytest.mark.parametrize("scenario", exercise.SCENARIOS, ids=lambda s: s.name)
def test_the_scenarios_do_what_they_say(scenario: exercise.Scenario) -> None:
    """A correct step overflows only in the overflow scenario, and stays near fp32 elsewhere."""
    losses, change, scale, stepped = reference_run(scenario)
    if scenario.overflows:  # skipped, and the scale backed off
        assert (stepped, scale) == (0, scenario.init_scale / 2) and not change.any()
        assert scenario.init_scale / 32 > exercise.INIT_SCALE  # a wide margin, see the module
        return
    assert (stepped, scale) == (scenario.steps, scenario.init_scale)  # nothing skipped
    ref_losses, ref_params = exercise._fp32_reference(scenario)
    ref_change = ref_params - exercise._params(scenario.problem()[0])
    rel = ((change - ref_change).norm() / ref_change.norm()).item()
    assert rel < exercise.PARAMS_RTOL[scenario.optimizer] / 2  # the tolerance has room
    assert losses == pytest.approx(ref_losses, rel=exercise.LOSS_RTOL / 5)


def first_norms(scenario: exercise.Scenario) -> list[float]:
    """The fp32 gradient norm of each of the scenario's batches, at the initial parameters."""
    model, data = scenario.problem()
    norms = []
    for inputs, targets in data:
        model.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm()
                                                           for p in model.parameters()])).item())
    return norms


def test_the_clip_fires_on_the_first_step() -> None:
    """MAX_NORM is below the first step's gradient norm, so a missing clip shows."""
    for scenario in exercise.SCENARIOS:
        if scenario.max_grad_norm == exercise.MAX_NORM:
            assert first_norms(scenario)[0] > 2 * exercise.MAX_NORM, scenario.name


def test_the_loose_clip_never_fires() -> None:
    """LOOSE_NORM is above every batch's gradient norm where it is the limit: a clip that fires
    there scales up."""
    for scenario in exercise.SCENARIOS:
        if scenario.max_grad_norm == exercise.LOOSE_NORM:
            # measured: 0.54 at most (the short batch of 24), 0.2-0.3 for the others
            assert max(first_norms(scenario)) < exercise.LOOSE_NORM / 1.5, scenario.name
            break
    else:
        raise AssertionError("no scenario clips at LOOSE_NORM")


def test_the_drawn_scenarios_differ_in_steps_and_batch_sizes() -> None:
    """The step counts and batch sizes are drawn: they differ between scenarios and between the
    steps of one, each scenario has a short batch, and the course's fixed shape (3 steps of 64)
    is none of them."""
    scenarios = exercise.SCENARIOS
    assert scenarios == exercise.draw_scenarios(exercise.SEED)  # repeatable
    assert {s.optimizer for s in scenarios} == {"SGD", "Adam"}
    assert [s.max_grad_norm for s in scenarios].count(exercise.LOOSE_NORM) == 1
    assert [s.overflows for s in scenarios].count(True) == 1
    stepping = [s for s in scenarios if not s.overflows]
    assert len({s.steps for s in stepping}) > 1
    assert all(2 <= s.steps <= 5 for s in stepping)
    assert len({s.sizes for s in scenarios}) == len(scenarios)
    for s in scenarios:
        assert len(s.sizes) == s.steps == len(set(s.sizes)), s.name
        assert min(s.sizes) in exercise.SHORT and s.sizes != (64,) * 3, s.name
        assert [len(x) for x, _ in s.problem()[1]] == list(s.sizes), s.name


def test_an_answer_for_the_fixed_batch_size_is_rejected() -> None:
    """A loss that divides a sum by 64, the course's batch size, is the mean only for batches
    of 64: the drawn sizes show it."""
    wrong = variant(SOLUTIONS / "fp16_step.py", "fp16_step",
                    ("loss = loss_fn(model(inputs), targets)",
                     "loss = ((model(inputs).float() - targets) ** 2).sum() / 64"))
    model, data = exercise.make_step_problem()  # the fixed shape: right there
    assert wrong(model, torch.optim.SGD(model.parameters(), lr=0.1),
                 torch.amp.GradScaler("cpu", init_scale=exercise.INIT_SCALE), *data[0],
                 nn.MSELoss(), exercise.MAX_NORM) == pytest.approx(
        nn.functional.mse_loss(exercise.make_step_problem()[0](data[0][0]), data[0][1]).item(),
        rel=exercise.LOSS_RTOL)
    result = check_fp16_step(wrong)
    assert not result.passed and exercise.LOSS_NOT_LIKE_FP32 in result.keys, str(result)


def test_problem_is_repeatable_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    (model_a, data_a), (model_b, data_b) = (exercise.make_step_problem() for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(exercise._params(model_a), exercise._params(model_b))
    assert torch.equal(data_a[0][0], data_b[0][0])
