# Reference solution of the accumulation exercise in notebooks/05_amp_recipes.py.
# The test run puts this source in place of the learner's cell (see conftest.py); try the
# exercise before reading it.
import torch


def train_accumulated(model, optimizer, scaler, micro_batches, loss_fn, accumulation_steps,
                      device_type, amp_dtype, max_grad_norm=None):
    """One optimizer step per group of micro-batches; return each step's (mean) loss."""
    losses = []
    for start in range(0, len(micro_batches), accumulation_steps):
        group = micro_batches[start:start + accumulation_steps]  # the last may be shorter
        optimizer.zero_grad(set_to_none=True)
        group_loss = 0.0
        for inputs, targets in group:
            with torch.autocast(device_type=device_type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets) / len(group)  # the group's mean
            scaler.scale(loss).backward()  # gradients add up in .grad, all at one scale
            group_loss += loss.item()
        if max_grad_norm is not None:
            scaler.unscale_(optimizer)  # once, after the group's last backward
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)  # once per group
        scaler.update()
        losses.append(group_loss)
    return losses
