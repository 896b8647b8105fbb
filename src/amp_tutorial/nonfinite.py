"""Finding inf/NaN: a guard that stops training with a clear message, and a tracer for the op.

Under fp16 a GradScaler skips steps whose *gradients* overflow, which is normal now and then. A
non-finite *loss* is different: the forward pass itself overflowed (or the data is bad), and
skipping steps will not fix it. Stop, then find the first module whose output went non-finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class NonFiniteLossError(FloatingPointError):
    """Raised by ``check_finite_loss`` when the loss is inf or NaN.
    """


def check_finite_loss(loss: torch.Tensor | float, step: int) -> float:
    """Return the loss as a float, or raise NonFiniteLossError saying where and what to do next.

    Reading the value synchronises the device; in a long run, check every few steps instead.
    """
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"loss is {value} at step {step}. The forward pass produced inf/NaN: find the first "
            "module whose output is non-finite (amp_tutorial.nonfinite.first_nonfinite_module), "
            "check the inputs' range (fp16 overflows above 65504), or run that region in fp32 "
            "with torch.autocast(..., enabled=False)."
        )
    return value


@dataclass(frozen=True)
class NonFiniteOutput:
    """The first module (in execution order) whose output held inf or NaN.
    """

    name: str  # the module's name in model.named_modules(), e.g. "layers.0"
    module_type: str
    dtype: torch.dtype
    n_inf: int
    n_nan: int

    def __str__(self) -> str:
        return (f"{self.name} ({self.module_type}) produced {self.n_inf} inf and {self.n_nan} NaN "
                f"values in {self.dtype}")


def first_nonfinite_module(model: nn.Module, fn: Callable[[], object]) -> NonFiniteOutput | None:
    """Run ``fn()`` (e.g. a forward pass) with forward hooks on every submodule of ``model``.

    Returns the first module whose output was non-finite while its inputs were all finite (the
    module that *created* the inf/NaN), or None if every output stayed finite.
    """
    found: list[NonFiniteOutput] = []

    def hook(name: str) -> Callable[..., None]:
        def check(module: nn.Module, inputs: tuple[object, ...], output: object) -> None:
            if found:
                return
            if all(bool(t.isfinite().all()) for t in _tensors(inputs)):
                bad = [t for t in _tensors(output) if not bool(t.isfinite().all())]
                if bad:
                    found.append(NonFiniteOutput(
                        name, type(module).__name__, bad[0].dtype,
                        sum(int(t.isinf().sum()) for t in bad),
                        sum(int(t.isnan().sum()) for t in bad)))
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        fn()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
