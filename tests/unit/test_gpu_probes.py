"""course_tools.gpu_probes: the facts a GPU check names its run by, and probes that decide a
register row, each failure reported by its first line rather than raised."""

from __future__ import annotations

import platform

import pytest
import torch

from course_tools import gpu_probes


def test_a_cpu_run_names_torch_and_python_and_no_gpu() -> None:
    result = gpu_probes.run("cpu")
    env = result["environment"]
    assert (env["torch"], env["cuda"], env["python"]) == (
        torch.__version__, torch.version.cuda, platform.python_version())
    assert env["gpu"] is None and env["driver"] is None and env["cpu"]
    assert result["probes"]["cuda-bf16"] == {"status": "not decidable",
                                              "detail": "needs a CUDA GPU"}


def test_a_probe_that_raises_is_failed_with_its_first_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def offers_bf16_without_native_support() -> str:
        raise AssertionError("bf16 offered: True, native: False\nsecond line")

    monkeypatch.setattr(gpu_probes, "PROBES", {"cuda-bf16": offers_bf16_without_native_support})
    monkeypatch.setattr(gpu_probes, "NEEDS_CUDA", set())
    assert gpu_probes.run("cpu")["probes"]["cuda-bf16"] == {
        "status": "failed", "detail": "AssertionError: bf16 offered: True, native: False"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None,
                    reason="needs a CUDA GPU")
def test_on_a_cuda_gpu_the_bf16_probe_passes() -> None:
    assert gpu_probes.run("cuda")["probes"]["cuda-bf16"]["status"] == "passed"
