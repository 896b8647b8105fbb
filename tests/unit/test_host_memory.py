"""Freed host memory kept for reuse: what glibc does with and without keep_freed_memory().

Each case runs in a fresh Python, so the allocator starts untouched. A "step" allocates and frees
64 MiB of tensors, as a training step does with its activations.
"""

import subprocess
import sys

import pytest

from amp_tutorial.host_memory import MALLOC_ENV, glibc_version, keep_freed_memory

STEPS = """
import resource, sys
import torch
from amp_tutorial.host_memory import keep_freed_memory
note = keep_freed_memory()
def step():
    x = torch.ones(8 * 2**20)  # 32 MiB
    return float((x * 2)[-1])  # and 32 MiB more
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
# the steady state: the median of the last 8 steps. Not their sum: the kernel's own bookkeeping
# (NUMA balancing on a VM unmaps pages now and then) can fault one step's pages in again
print(sorted(faults[-8:])[4])
print(note)
"""
PAGES_PER_STEP = 64 * 2**20 // 4096


def page_faults(env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True,
                          check=True, env=env, timeout=120)
    faults, note = done.stdout.splitlines()[-2:]
    return int(faults), note


@pytest.fixture
def env(monkeypatch):
    import os
    monkeypatch.delenv(MALLOC_ENV, raising=False)
    return dict(os.environ)


@pytest.mark.skipif(glibc_version() is None, reason="glibc only: mallopt is glibc's")
def test_kept_memory_stops_the_page_faults_of_every_step(env):
    kept, note = page_faults(env)
    system, system_note = page_faults({**env, MALLOC_ENV: "system"})
    # glibc's defaults hand each 32 MiB buffer back to the kernel (it is at the mmap threshold's
    # ceiling), so every step faults every page in again; kept, the steady state reuses them
    assert system >= PAGES_PER_STEP * 0.9, system
    assert kept < system / 100, (kept, system)
    assert "keeps freed blocks for reuse" in note
    assert f"{MALLOC_ENV}=system" in system_note


def test_the_note_is_decided_once():
    assert keep_freed_memory() is keep_freed_memory()
