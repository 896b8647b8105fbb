"""check_finite_loss stops on inf/NaN; first_nonfinite_module names the module that made it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from amp_tutorial.models import ConvModel
from amp_tutorial.nonfinite import NonFiniteLossError, check_finite_loss, first_nonfinite_module


def test_finite_loss_passes_through() -> None:
    assert check_finite_loss(torch.tensor(0.25), step=3) == 0.25


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_loss_raises_with_the_step(value: float) -> None:
    with pytest.raises(NonFiniteLossError, match="at step 7"):
        check_finite_loss(torch.tensor(value), step=7)


def test_tracer_names_the_module_that_created_the_nan() -> None:
    torch.manual_seed(0)
    model = ConvModel(hidden=8, n_hidden_layers=1)
    with torch.no_grad():
        model.layers[3].weight[0, 0] = math.inf  # the second conv; later layers inherit the inf
    found = first_nonfinite_module(model, lambda: model(torch.rand(1, 2, 4, 4)))
    assert found is not None and found.name == "layers.3"
    assert found.module_type == "Conv2d" and found.n_inf + found.n_nan > 0
    assert all(not m._forward_hooks for m in model.modules())  # hooks removed


def test_tracer_sees_an_fp16_overflow_and_nothing_in_fp32() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    x = torch.full((1, 2), 1e5)  # above fp16's max, 65504
    assert first_nonfinite_module(model, lambda: model(x)) is None
    with torch.autocast("cpu", dtype=torch.float16):
        found = first_nonfinite_module(model, lambda: model(x))
    assert found is not None and found.name == "0" and found.dtype == torch.float16
