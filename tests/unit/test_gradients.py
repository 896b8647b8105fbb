"""gradients: the norms match clip_grad_norm_ and a hand computation, and a skipped step is 0."""

import pytest
import torch

from amp_tutorial.gradients import (
    activation_grads,
    grad_norm,
    snapshot,
    update_norm,
    zero_fraction,
)


def test_grad_norm_is_what_clip_grad_norm_measures() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    model(torch.randn(5, 4)).sum().backward()
    measured = grad_norm(model.parameters())
    clip_saw = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    assert measured == pytest.approx(clip_saw, rel=1e-6) and measured > 0


def test_grad_norm_skips_parameters_without_grad() -> None:
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    a.grad = torch.tensor([3.0, 4.0])
    assert grad_norm([a, b]) == pytest.approx(5.0)
    assert grad_norm([b]) == 0.0


def test_update_norm_of_an_sgd_step_is_lr_times_grad_norm() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    w.grad = torch.tensor([6.0, 8.0])
    before = snapshot([w])
    assert update_norm(before, [w]) == 0.0  # nothing moved yet
    torch.optim.SGD([w], lr=0.5).step()
    assert update_norm(before, [w]) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="1 saved tensors for 2"):
        update_norm(before, [w, w])


def _conv_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 1), torch.nn.ReLU(), torch.nn.Conv2d(4, 1, 1))


def test_activation_grads_collects_every_conv_output_and_unscales() -> None:
    x, y = torch.rand(1, 2, 8, 8), torch.rand(1, 1, 8, 8)
    raw, unscaled = activation_grads(_conv_net(), x, y)
    assert raw.dtype == torch.float32 and raw.numel() == 4 * 64 + 1 * 64  # both conv outputs
    raw_scaled, unscaled_scaled = activation_grads(_conv_net(), x, y, loss_scale=2.0**10)
    torch.testing.assert_close(raw_scaled, raw * 2.0**10)  # backward ran on the scaled loss
    torch.testing.assert_close(unscaled_scaled, unscaled)  # a power of two divides out exactly
    model = _conv_net()
    activation_grads(model, x, y)
    assert not model[0]._forward_hooks  # the hooks are removed again


def test_activation_grads_in_fp16_are_fp16_and_zero_fraction_counts_them() -> None:
    x, y = torch.rand(1, 2, 8, 8), torch.rand(1, 1, 8, 8)
    raw, unscaled = activation_grads(_conv_net(), x, y, torch.float16)
    assert raw.dtype == torch.float16 and unscaled.dtype == torch.float32
    assert zero_fraction(torch.tensor([0.0, 1.0, 0.0, -2.0])) == 0.5
    assert zero_fraction(raw) < 1.0
