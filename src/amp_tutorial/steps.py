"""One optimisation step, fp32 or AMP, as the benchmark and the tests use it, for both of the
course's problems (the seed image and the transformer's reversal task).

The lessons write the same loop out in their cells, because there it is the lesson; this is that
loop, with the idiom the lessons teach: one GradScaler, ``enabled`` only for float16, and the same
three scaler calls whether it is on or off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from amp_tutorial.reversal_task import IGNORE_INDEX, sequence_loss


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Callable[[int], float]:
    """Return ``step(i) -> loss`` that trains one step; ``amp_dtype=None`` means plain fp32.

    Only the forward pass and the loss run under autocast; backward and the optimizer step do not.
    ``scaler`` (needed for float16) scales the loss before backward and skips steps whose
    gradients overflowed; without one, a disabled ``GradScaler`` makes the same calls plain
    ``backward()`` and ``optimizer.step()``.
    """
    return _amp_train_step(model, optimizer, lambda _: (inputs, targets), nn.MSELoss(),
                           inputs.device.type, amp_dtype, scaler)


def _amp_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device_type: str,
    amp_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler | None,
) -> Callable[[int], float]:
    """The one AMP training step both course models use: ``step(i)`` trains on ``batch(i)``."""
    if scaler is None:  # off: scale() returns the loss, step() calls optimizer.step()
        scaler = torch.amp.GradScaler(device_type, enabled=False)

    def step(i: int) -> float:
        inputs, targets = batch(i)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    return step


def make_inference_step(
    model: nn.Module, inputs: torch.Tensor, amp_dtype: torch.dtype | None = None
) -> Callable[[int], torch.Tensor]:
    """Return ``step(i) -> output`` running one forward pass in eval mode, no autograd.
    """
    model.eval()
    device_type = inputs.device.type

    def step(_: int) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(
            device_type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None
        ):
            return model(inputs)

    return step


def make_sequence_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Callable[[int], float]:
    """Like :func:`make_train_step` for the course's transformer: cross-entropy on token batches.

    ``step(i)`` trains on ``batches[i % len(batches)]`` (warm-up steps pass negative ``i``), so
    every precision mode sees the same data in the same order.
    """
    return _amp_train_step(model, optimizer, lambda i: batches[i % len(batches)], sequence_loss,
                           batches[0][0].device.type, amp_dtype, scaler)


def sequence_accuracy(
    model: nn.Module,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    amp_dtype: torch.dtype | None = None,
) -> float:
    """Answer-token accuracy of ``model`` over ``batches`` (eval mode, no autograd, same autocast
    as training); ``model`` is put back in train mode afterwards.
    """
    model.eval()
    correct = total = 0
    with torch.inference_mode(), torch.autocast(batches[0][0].device.type,
                                                dtype=amp_dtype or torch.float32,
                                                enabled=amp_dtype is not None):
        for inputs, targets in batches:
            answer = targets != IGNORE_INDEX
            correct += int((model(inputs).argmax(-1)[answer] == targets[answer]).sum())
            total += int(answer.sum())
    model.train()
    return correct / total
