"""check_train_with_amp: every listed mistake is named, and every correct variant passes.

Each wrong implementation below is the reference loop with exactly one mistake, so the checker must
report that mistake's key and nothing else.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

from amp_tutorial import exercise
from amp_tutorial.exercise import check_train_with_amp

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "train_with_amp.py"
reference_solution = runpy.run_path(str(SOLUTION))["train_with_amp"]


# -- one mistake each ------------------------------------------------------------------------------
def loss_not_scaled(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                    max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            loss.backward()  # mistake
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def scaler_disabled_for_fp16(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                             max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=False)  # mistake
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def optimizer_step_direct(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                          max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()  # mistake: no skip on inf/NaN
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def no_scaler_update(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                     max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)  # mistake: no scaler.update() after it
            total += loss.item()
        history.append(total / len(data))
    return history


def grads_not_zeroed(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                     max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    optimizer.zero_grad()  # mistake: once, not every step
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def forward_not_autocast(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                         max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)  # mistake: no autocast
            scaler.scale(loss).backward()
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def backward_in_autocast(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                         max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
                scaler.scale(loss).backward()  # mistake: inside the with block
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def clip_before_unscale(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                        max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            if max_grad_norm is not None:  # mistake: clips the scaled gradients
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def clipping_ignored(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                     max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()  # mistake: max_grad_norm never used
            scaler.step(optimizer)
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def _history_mistake(record):
    """The reference loop, with ``record(losses, scaled_losses)`` making the returned history."""
    def train(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype, max_grad_norm=None):
        scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
        losses, scaled = [], []
        for _ in range(epochs):
            for inputs, targets in data:
                optimizer.zero_grad()
                with torch.autocast(device_type, dtype=amp_dtype):
                    loss = loss_fn(model(inputs), targets)
                scaled_loss = scaler.scale(loss)
                scaled_loss.backward()
                if max_grad_norm is not None:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                losses.append(loss)
                scaled.append(scaled_loss.item())
        return record(losses, scaled, len(data))
    return train


def _epoch_means(values, n_batches):
    return [sum(values[i:i + n_batches]) / n_batches for i in range(0, len(values), n_batches)]


WRONG = {
    "loss not scaled": (loss_not_scaled, exercise.LOSS_NOT_SCALED),
    "scaler disabled in fp16": (scaler_disabled_for_fp16, exercise.LOSS_NOT_SCALED),
    "optimizer.step direct": (optimizer_step_direct, exercise.OPTIMIZER_STEP_DIRECT),
    "no scaler.update": (no_scaler_update, exercise.NO_SCALER_UPDATE),
    "grads not zeroed": (grads_not_zeroed, exercise.GRADS_NOT_ZEROED),
    "forward not autocast": (forward_not_autocast, exercise.FORWARD_NOT_AUTOCAST),
    "backward in autocast": (backward_in_autocast, exercise.BACKWARD_IN_AUTOCAST),
    "clip before unscale_": (clip_before_unscale, exercise.CLIP_BEFORE_UNSCALE),
    "clipping ignored": (clipping_ignored, exercise.NOT_CLIPPED),
    "returns None": (_history_mistake(lambda losses, scaled, n: None), exercise.BAD_HISTORY),
    "history of tensors": (_history_mistake(lambda losses, scaled, n: losses[::n]),
                           exercise.BAD_HISTORY),
    "one loss per step": (_history_mistake(lambda losses, scaled, n: [x.item() for x in losses]),
                          exercise.BAD_HISTORY),
    "scaled losses": (_history_mistake(lambda losses, scaled, n: _epoch_means(scaled, n)),
                      exercise.BAD_HISTORY),
    "last batch, not mean": (
        _history_mistake(lambda losses, scaled, n: [x.item() for x in losses[n - 1::n]]),
        exercise.HISTORY_NOT_LIKE_FP32),
}

# Mistakes that also make GradScaler raise (it refuses step() without scale(), a second step()
# without update(), and update() without step()); the checker names the mistake, then the error.
ALSO_RAISES = {"loss not scaled", "no scaler.update", "optimizer.step direct"}


@pytest.mark.parametrize("name", list(WRONG))
def test_each_mistake_is_named(name: str) -> None:
    fn, key = WRONG[name]
    result = check_train_with_amp(fn)
    assert not result.passed
    expected = {key, exercise.RAISED} if name in ALSO_RAISES else {key}
    assert result.keys <= expected and key in result.keys, str(result)
    assert all(p.message for p in result.problems)


def test_report_is_plain_words() -> None:
    result = check_train_with_amp(loss_not_scaled)
    text = str(result)
    assert "scaler.scale(loss).backward()" in text and "float16" in text


def test_a_crash_is_reported_not_raised() -> None:
    def broken(*args, **kwargs):
        raise ValueError("not done yet")

    result = check_train_with_amp(broken)
    assert result.keys == {exercise.RAISED}
    assert "ValueError: not done yet" in str(result)


def test_checker_leaves_torch_unpatched() -> None:
    backward, scale = torch.autograd.backward, torch.amp.GradScaler.scale
    check_train_with_amp(clip_before_unscale)
    assert torch.autograd.backward is backward and torch.amp.GradScaler.scale is scale


# -- correct variants ------------------------------------------------------------------------------
def bf16_without_scaler(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                        max_grad_norm=None):
    use_scaler = amp_dtype == torch.float16
    scaler = torch.amp.GradScaler(device_type) if use_scaler else None
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad()
            with torch.autocast(device_type=device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            if scaler is None:  # bf16: plain backward and step
                loss.backward()
                if max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                if max_grad_norm is not None:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history


def enabled_toggles_amp_spelling_no_set_to_none(model, data, optimizer, loss_fn, epochs,
                                                device_type, amp_dtype, max_grad_norm=None):
    use_amp = True
    scaler = torch.amp.GradScaler(device_type, enabled=use_amp and amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        losses = []
        for inputs, targets in data:
            with torch.amp.autocast(device_type, dtype=amp_dtype, enabled=use_amp):
                outputs = model(inputs)
            loss = loss_fn(outputs, targets)  # the loss outside autocast is fine too
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=False)  # zeroing after the step works as well
            losses.append(loss.detach())
        history.append(torch.stack(losses).mean().item())
    return history


def scaler_always_on_model_zero_grad(model, data, optimizer, loss_fn, epochs, device_type,
                                     amp_dtype, max_grad_norm=None):
    scaler = torch.amp.GradScaler(device_type, init_scale=2.0**10, growth_interval=3)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            model.zero_grad()
            with torch.autocast(device_type, amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaled = scaler.scale(loss)
            scaled.backward()
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_value_(model.parameters(), 1e9)  # no-op, then the norm
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            total += float(loss.detach())
        history.append(total / len(data))
    return history


CORRECT = {
    "reference solution": reference_solution,
    "bf16 without a scaler": bf16_without_scaler,
    "enabled= toggles, torch.amp.autocast, set_to_none=False": (
        enabled_toggles_amp_spelling_no_set_to_none),
    "scaler on for bf16 too, model.zero_grad": scaler_always_on_model_zero_grad,
}


@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_variants_pass(name: str) -> None:
    result = check_train_with_amp(CORRECT[name])
    assert result.passed, str(result)
    assert "All checks passed" in str(result)


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
