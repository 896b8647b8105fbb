# Reference solution of the exercise in notebooks/02_gradient_scaling.py.
# The test run puts this source in place of the learner's cell (see conftest.py); try the
# exercise before reading it.
import torch


def fp16_step(model, optimizer, scaler, inputs, targets, loss_fn, max_norm):
    """One float16 training step with gradient clipping; return the loss as a float."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=torch.float16):
        loss = loss_fn(model(inputs), targets)  # forward and loss only
    scaler.scale(loss).backward()  # outside autocast
    scaler.unscale_(optimizer)  # the true gradients, so the clip measures their norm
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skips the step if a gradient is inf/NaN
    scaler.update()  # backs the scale off after a skipped step
    return loss.item()
