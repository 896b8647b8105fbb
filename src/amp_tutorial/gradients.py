"""Norms of gradients and of optimizer updates, to see what clipping and scaling change.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def grad_norm(parameters: Iterable[torch.Tensor]) -> float:
    """The total 2-norm of the ``.grad`` of ``parameters`` (those without a gradient are skipped),
    the same number ``clip_grad_norm_`` measures.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()


def snapshot(parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``parameters``, to measure the next update against.
    """
    return [p.detach().clone() for p in parameters]


def update_norm(before: list[torch.Tensor], parameters: Iterable[torch.Tensor]) -> float:
    """The total 2-norm of ``parameters - before``: how far one optimizer step moved the weights
    (0.0 when the step was skipped).
    """
    after = list(parameters)
    if len(after) != len(before):
        raise ValueError(f"{len(before)} saved tensors for {len(after)} parameters")
    return torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm((p.detach() - b).float()) for p, b in zip(after, before,
                                                                              strict=True)])).item()


def activation_grads(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    dtype: torch.dtype | None = None,
    loss_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients that reach every ``Conv2d`` output in one forward + MSE loss + backward.

    The forward runs under autocast in ``dtype`` (``None``: plain fp32) and backward runs on
    ``loss * loss_scale``. Returns ``(raw, unscaled)``, each flattened into one tensor: ``raw`` as
    backward computed them (their own dtype, still times ``loss_scale``), ``unscaled`` divided by
    ``loss_scale`` in fp32.
    """
    grads: list[torch.Tensor] = []

    def keep_grad(module: torch.nn.Module, args: object, output: torch.Tensor) -> None:
        output.register_hook(grads.append)

    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    handles = [conv.register_forward_hook(keep_grad) for conv in convs]
    try:
        with torch.autocast(inputs.device.type, dtype=dtype or torch.float32,
                            enabled=dtype is not None):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
        (loss * loss_scale).backward()
    finally:
        for handle in handles:
            handle.remove()
    raw = torch.cat([g.flatten() for g in grads])
    return raw, raw.float() / loss_scale


def zero_fraction(values: torch.Tensor) -> float:
    """The share of entries that are exactly zero: gradients lost to underflow.
    """
    return (values == 0).float().mean().item()
