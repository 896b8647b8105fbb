"""One optimisation step of the seed problem, fp32 or AMP, as used by the benchmark and the tests.

The notebooks write the same loop out in their cells, because there it is the lesson.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


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
    A ``scaler`` (needed for float16) scales the loss before backward and skips steps whose
    gradients overflowed.
    """
    device_type = inputs.device.type
    loss_fn = nn.MSELoss()

    def step(_: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            loss = loss_fn(model(inputs), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.item()

    return step


def make_inference_step(
    model: nn.Module, inputs: torch.Tensor, amp_dtype: torch.dtype | None = None
) -> Callable[[int], torch.Tensor]:
    """Return ``step(i) -> output`` running one forward pass in eval mode, no autograd."""
    model.eval()
    device_type = inputs.device.type

    def step(_: int) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(
            device_type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None
        ):
            return model(inputs)

    return step
