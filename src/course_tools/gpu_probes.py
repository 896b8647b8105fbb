"""What a ``course_tools.gpu_check`` run records about its machine, and the register rows it
decides with a probe of its own rather than a lesson: ``python -m course_tools.gpu_probes
DEVICE RESULT.json``.

Runs in a child process of its own, so the checking command never holds a CUDA context while the
lessons run. The environment: the GPU's name and compute capability, the NVIDIA driver
(``nvidia-smi``), torch, the CUDA (or HIP) torch was built with, Python, the CPU.
"""

from __future__ import annotations

import inspect
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi``, or None where there is none."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict[str, Any]:
    """The facts a verdict names its run by."""
    env: dict[str, Any] = {"device": device, "torch": torch.__version__,
                           "cuda": torch.version.cuda, "hip": torch.version.hip,
                           "python": platform.python_version(), "cpu": cpu_name(),
                           "gpu": None, "capability": None, "gpu_memory_bytes": None,
                           "driver": None}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_bytes=props.total_memory, driver=nvidia_driver())
    return env


def probe_cuda_bf16() -> str:
    """``device-cuda-bf16``: the course offers bf16 on this GPU exactly where it is native, and a
    GPU without it says why (as ``test_device.py::test_gpu_offers_bf16_only_where_native``)."""
    from amp_tutorial.device import BF16_NOT_OFFERED, select_device

    info = select_device("cuda")
    if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    else:
        native = torch.cuda.get_device_capability()[0] >= 8
    offered = torch.bfloat16 in info.amp_dtypes
    assert offered is native, f"bf16 offered: {offered}, native: {native}"
    says_why = any(note.startswith(BF16_NOT_OFFERED) for note in info.notes)
    assert says_why is not native, f"notes {info.notes!r} with native bf16 {native}"
    return f"bf16 native {native}, offered {offered}; AMP dtypes {info}"


PROBES: dict[str, Callable[[], str]] = {"cuda-bf16": probe_cuda_bf16}
NEEDS_CUDA = {"cuda-bf16"}


def run(device: str) -> dict[str, Any]:
    """The environment and each probe's outcome (a probe that needs CUDA is not run on a CPU)."""
    result: dict[str, Any] = {"environment": environment(device), "probes": {}}
    for name, probe in PROBES.items():
        if name in NEEDS_CUDA and not (device.startswith("cuda") and torch.cuda.is_available()
                                       and torch.version.hip is None):
            result["probes"][name] = {"status": "not decidable", "detail": "needs a CUDA GPU"}
            continue
        try:
            result["probes"][name] = {"status": "passed", "detail": probe()}
        except Exception as error:  # noqa: BLE001 - a probe's failure is its verdict
            lines = str(error).strip().splitlines()
            detail = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
            result["probes"][name] = {"status": "failed", "detail": detail}
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m course_tools.gpu_probes DEVICE RESULT.json", file=sys.stderr)
        return 2
    Path(args[1]).write_text(json.dumps(run(args[0]), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
