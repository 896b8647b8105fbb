"""Device selection: the right device, a clear error for one that is missing, honest dtypes."""

import pytest
import torch

from amp_tutorial.device import (
    DEVICE_ENV,
    DeviceNotAvailableError,
    available_devices,
    describe_device,
    dtype_name,
    fp32_baseline,
    select_device,
)


def test_cpu_is_always_available_and_last():
    devices = available_devices()
    assert devices[-1] == "cpu"
    assert ("cuda" in devices) == torch.cuda.is_available()


def test_default_picks_best_available(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert select_device().type == available_devices()[0]


def test_cpu_uses_bf16_without_scaler():
    info = select_device("cpu")
    assert info.amp_dtype == torch.bfloat16
    assert not info.needs_grad_scaler()
    assert info.needs_grad_scaler(torch.float16)
    assert not info.has_allocator_stats
    assert info.backend == "CPU" and info.name


def test_env_variable_overrides(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert select_device().type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA/ROCm GPU")
def test_missing_device_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(DeviceNotAvailableError, match=r"'cuda' is not available.*available: .*cpu"):
        select_device()


def test_nonsense_device_name_lists_choices():
    with pytest.raises(DeviceNotAvailableError, match="cuda, mps, xpu, cpu"):
        select_device("gpu0")


def test_dtype_names_and_description():
    assert [dtype_name(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == [
        "fp32", "fp16", "bf16"]
    text = describe_device(select_device("cpu"))
    assert "bf16" in text and "no GradScaler needed" in text


def test_cpu_baseline_is_plain_fp32():
    assert fp32_baseline(select_device("cpu")) == "fp32"
