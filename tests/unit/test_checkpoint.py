"""save_checkpoint / load_checkpoint: model, optimizer and scaler round-trip; fp32 <-> AMP;
parameter_hash: equal exactly when the parameters are bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from amp_tutorial.checkpoint import load_checkpoint, parameter_hash, save_checkpoint


def _setup(scaler_enabled: bool) -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1,
                                  enabled=scaler_enabled)
    return model, optimizer, scaler


def _train(model, optimizer, scaler, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        scaler.scale(model(torch.ones(3, 4)).square().mean()).backward()
        scaler.step(optimizer)
        scaler.update()


def test_round_trip_restores_model_optimizer_scaler_and_extra(tmp_path: Path) -> None:
    model, optimizer, scaler = _setup(True)
    _train(model, optimizer, scaler, 3)
    assert scaler.get_scale() == 2.0**11  # grew once per step
    save_checkpoint(tmp_path / "sub" / "ckpt.pt", model, optimizer, scaler, step=3)
    assert not (tmp_path / "sub" / "ckpt.pt.tmp").exists()

    model2, optimizer2, scaler2 = _setup(True)
    nn.init.zeros_(model2.weight)
    extra = load_checkpoint(tmp_path / "sub" / "ckpt.pt", model2, optimizer2, scaler2)
    assert extra == {"step": 3}
    assert torch.equal(model2.weight, model.weight)
    assert optimizer2.state_dict()["state"][0]["step"] == 3
    assert scaler2.get_scale() == scaler.get_scale()


def test_fp32_checkpoint_resumes_with_a_fresh_scaler_and_back(tmp_path: Path) -> None:
    model, optimizer, off = _setup(False)  # fp32 / bf16: the scaler is disabled, has no state
    _train(model, optimizer, off, 2)
    save_checkpoint(tmp_path / "fp32.pt", model, optimizer, off)
    model2, optimizer2, on = _setup(True)
    load_checkpoint(tmp_path / "fp32.pt", model2, optimizer2, on)
    assert on.get_scale() == 2.0**8  # left at its initial scale
    assert torch.equal(model2.bias, model.bias)

    _train(model2, optimizer2, on, 1)
    save_checkpoint(tmp_path / "amp.pt", model2, optimizer2, on)
    model3, optimizer3, off3 = _setup(False)
    load_checkpoint(tmp_path / "amp.pt", model3, optimizer3, off3)  # scale ignored, no error
    assert torch.equal(model3.weight, model2.weight)


def test_wrapped_models_save_plain_keys_and_foreign_files_are_refused(tmp_path: Path) -> None:
    model, optimizer, _ = _setup(False)
    save_checkpoint(tmp_path / "c.pt", nn.DataParallel(model), optimizer)
    assert set(torch.load(tmp_path / "c.pt")["model"]) == {"weight", "bias"}
    torch.save({"weight": model.weight}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by save_checkpoint"):
        load_checkpoint(tmp_path / "other.pt", model)


def test_parameter_hash_is_equal_exactly_when_parameters_are_bit_identical(
        tmp_path: Path) -> None:
    model, optimizer, scaler = _setup(True)
    _train(model, optimizer, scaler, 2)
    save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, scaler)
    restored, _, _ = _setup(True)
    assert parameter_hash(restored) != parameter_hash(model)
    load_checkpoint(tmp_path / "ckpt.pt", restored)
    assert parameter_hash(restored) == parameter_hash(model)
    assert parameter_hash(nn.DataParallel(restored)) == parameter_hash(model)  # wrapper unwrapped
    with torch.no_grad():  # one ulp in one weight is a different hash
        restored.weight[0, 0] = torch.nextafter(restored.weight[0, 0], torch.tensor(1e9))
    assert parameter_hash(restored) != parameter_hash(model)
