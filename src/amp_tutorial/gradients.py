"""Norms of gradients and of optimizer updates, to see what clipping and scaling change.

Used by lesson 02 (clipping before or after ``unscale_``, with SGD and Adam) and lesson 09
(spotting skipped steps).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def grad_norm(parameters: Iterable[torch.Tensor]) -> float:
    """The total 2-norm of the ``.grad`` of ``parameters`` (those without a gradient are skipped),
    the same number ``clip_grad_norm_`` measures."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()


def snapshot(parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``parameters``, to measure the next update against."""
    return [p.detach().clone() for p in parameters]


def update_norm(before: list[torch.Tensor], parameters: Iterable[torch.Tensor]) -> float:
    """The total 2-norm of ``parameters - before``: how far one optimizer step moved the weights
    (0.0 when the step was skipped)."""
    after = list(parameters)
    if len(after) != len(before):
        raise ValueError(f"{len(before)} saved tensors for {len(after)} parameters")
    return torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm((p.detach() - b).float()) for p, b in zip(after, before,
                                                                              strict=True)])).item()
