"""Checkpoints that resume AMP training exactly: model, optimizer and GradScaler state together.

The scaler's state (current scale, growth tracker) is part of the training state: a run resumed
without it starts again from the initial scale. A disabled scaler (bf16, fp32) has no state, so
checkpoints move freely between fp32 and AMP runs: what the resuming run lacks is left at its
fresh value, what it does not use is ignored.

``parameter_hash`` tells whether two models hold bit-identical parameters (a resumed run against an
uninterrupted one, a checkpoint against the live model, DDP ranks against each other) with one
short string that can be printed, stored in a JSON summary or gathered across processes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT_VERSION = 1


def save_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
    **extra: Any,
) -> Path:
    """Write model, optimizer and scaler state (plus ``extra`` values, e.g. the step) to ``path``.

    Written to a temporary file and renamed, so an interrupted save never leaves a broken file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format_version": FORMAT_VERSION,
        "model": _unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else {},
        "extra": extra,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> dict[str, Any]:
    """Restore what ``save_checkpoint`` wrote into model, optimizer and scaler; return ``extra``.

    The scaler is restored only when both sides have one (an enabled scaler and a saved scale): an
    fp32 or bf16 checkpoint leaves an fp16 run's scaler at its initial scale, and an fp16
    checkpoint's scale is ignored by a run without a scaler.

    The file is read into host memory whatever device wrote it: ``load_state_dict`` copies each
    tensor to where its parameter lives (the optimizer's state too), and ``extra`` comes back on
    the CPU, where a ``torch.Generator``'s state must be (``set_state`` refuses a CUDA tensor,
    "RNG state must be a torch.ByteTensor", as mapping the file to the GPU gave on an H100).
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a checkpoint written by save_checkpoint "
                         f"(format_version {state.get('format_version')!r})")
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and scaler.is_enabled() and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    return state["extra"]


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel (or DataParallel), so keys have no prefix."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel |
                                      nn.DataParallel) else model


def parameter_hash(model: nn.Module) -> str:
    """SHA-256 of every parameter's name and bytes, in order: equal hashes mean bit-identical
    parameters (a DistributedDataParallel wrapper hashes like the model inside it).
    """
    digest = hashlib.sha256()
    for name, param in _unwrap(model).named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
