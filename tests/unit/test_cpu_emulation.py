"""When the suite's AVX2 emulation runs (tests/support/cpu_emulation.py): only where it changes
which kernels torch picks. Decided here for each CPU kind CI meets, by what torch reports."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from tests.support import ROOT, cpu_emulation

# (machine, ATen's capability, oneDNN's bf16) -> whether the emulation changes anything
KINDS = {
    "Zen 3 (AVX2, no bf16)": ("x86_64", "AVX2", False, False),
    "Zen 4 (AVX-512, avx512_bf16)": ("x86_64", "AVX512", True, True),
    "Xeon with AMX": ("x86_64", "AVX512", True, True),
    "AVX2 with avx_ne_convert (oneDNN bf16 on)": ("x86_64", "AVX2", True, True),
    "AVX-512 without bf16 (Skylake-SP)": ("x86_64", "AVX512", False, True),
    "arm64": ("aarch64", "SVE256", True, False),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_emulation_runs_only_where_it_changes_a_kernel(kind, monkeypatch) -> None:
    machine, capability, bf16, expected = KINDS[kind]
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr("amp_tutorial.device.onednn_bf16", lambda: bf16)
    changes, why = cpu_emulation.emulation_changes_kernels()
    assert changes is expected, why


def test_the_command_agrees_with_this_machine() -> None:
    """The README's test command reads the exit code: 0 runs the emulated unit tests."""
    changes, why = cpu_emulation.emulation_changes_kernels()
    done = subprocess.run([sys.executable, "-m", "tests.support.cpu_emulation"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == (0 if changes else 1)
    assert why in done.stdout


def test_under_the_emulation_no_cpu_is_left_that_it_would_change() -> None:
    """Run under its own caps, any x86 CPU looks like the one it imitates."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the caps are x86's")
    done = subprocess.run([sys.executable, "-m", "tests.support.cpu_emulation"], cwd=ROOT,
                          env={**os.environ, **cpu_emulation.AVX2_EMULATION},
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stdout


def test_a_command_runs_under_the_emulation_only_where_it_changes_something() -> None:
    changes, _ = cpu_emulation.emulation_changes_kernels()
    show = [sys.executable, "-c",
            "import os; print('cap=' + os.environ.get('ONEDNN_MAX_CPU_ISA', ''))"]
    done = subprocess.run([sys.executable, "-m", "tests.support.cpu_emulation", *show], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0
    assert ("cap=AVX2" in done.stdout) == changes and ("cap=" in done.stdout) == changes
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    done = subprocess.run([sys.executable, "-m", "tests.support.cpu_emulation", *failing],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == (3 if changes else 0)
