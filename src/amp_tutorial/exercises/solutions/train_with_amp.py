# Reference solution of the exercise in notebooks/06_exercise_train_with_amp.py.
# The test run puts this source in place of the learner's cell (see conftest.py); try the
# exercise before reading it.
import torch


def train_with_amp(model, data, optimizer, loss_fn, epochs, device_type, amp_dtype,
                   max_grad_norm=None):
    """Train with autocast (and a GradScaler for float16); return the mean loss of each epoch."""
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)
    history = []
    for _ in range(epochs):
        total = 0.0
        for inputs, targets in data:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()  # outside autocast; a no-op scale when disabled
            if max_grad_norm is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)  # skips the step if a gradient is inf/NaN
            scaler.update()
            total += loss.item()
        history.append(total / len(data))
    return history
