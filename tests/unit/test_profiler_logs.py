"""amp_tutorial.profiler_logs: the profiler's C++ log lines (kineto's) stay out of lesson output.

A lesson's kernel is a fresh process whose file descriptor 2 Jupyter shows as red stderr boxes; the
profiled steps here run in one, and what it writes there is read back. That each lesson's cells
show none of these lines in a real kernel, on every supported torch, is checked by the nbval run
(the root ``conftest.py``, ``pytest_runtest_call``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from amp_tutorial.profiler_logs import (
    KINETO_LOG_ENV,
    KINETO_LOG_OFF,
    kernel_environ,
    kineto_log_lines,
    quiet_kineto_logs,
)
from tests.support import ROOT

# What the lessons' kernels printed before (torch 2.14.1 and 2.9.0, a CUDA build, no GPU).
KINETO_OUTPUT = """\
USDT:2026-11-27 16:30:14 11279:11279 SyncActivityProfilerHandler.cpp:39] profiler_start
USDT:2026-11-27 16:30:14 11279:11279 SyncActivityProfilerHandler.cpp:46] profiler_stop
ERROR:2026-11-27 16:30:14 11279:11279 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35
STAGE:2026-11-27 16:37:43 18077:18077 ActivityProfilerController.cpp:381] Completed Stage: Warm Up
"""

# A profiled training step under autocast, as the lessons make them.
PROFILED_STEP = """
import torch
from torch.profiler import ProfilerActivity, profile

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(8, 16)).float().pow(2).mean()
    loss.backward()
assert any(e.key == "aten::addmm" for e in prof.key_averages())
print("profiled")
"""


def run_kernel_process(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh Python, as a lesson's kernel runs it, with exactly the environment
    ``env`` adds to this one without the profiler's setting (which this process's import of
    amp_tutorial made)."""
    base = {k: v for k, v in os.environ.items() if k != KINETO_LOG_ENV}
    result = subprocess.run([sys.executable, "-c", code], env={**base, **env},
                            capture_output=True, text=True, timeout=600, cwd=ROOT / "notebooks")
    assert result.returncode == 0 and "profiled" in result.stdout, result.stderr
    return result


def test_a_lesson_that_imports_the_course_profiles_without_log_lines() -> None:
    """Any kernel (a plain `jupyter lab`, VS Code): the lessons import amp_tutorial first."""
    result = run_kernel_process("import amp_tutorial\n" + PROFILED_STEP, {})
    assert kineto_log_lines(result.stderr) == [], result.stderr


def test_the_environment_the_course_gives_kernels_keeps_log_lines_out() -> None:
    """A kernel of the course's lab or image, even one that never imports amp_tutorial."""
    result = run_kernel_process(PROFILED_STEP, kernel_environ())
    assert kineto_log_lines(result.stderr) == [], result.stderr


def test_the_lines_are_kinetos_own() -> None:
    assert len(kineto_log_lines(KINETO_OUTPUT)) == 4
    kept = ("UserWarning: Profiler clears events at the end of each cycle.",
            "ERROR: the learner's own message", "RuntimeError: CUDA error: out of memory",
            "Traceback (most recent call last):")
    assert kineto_log_lines("\n".join(kept)) == []


@pytest.mark.parametrize(("before", "after"), [(None, KINETO_LOG_OFF), ("", KINETO_LOG_OFF),
                                               ("0", "0"), ("4", "4")])
def test_a_level_set_by_hand_is_kept(monkeypatch: pytest.MonkeyPatch, before: str | None,
                                     after: str) -> None:
    """``KINETO_LOG_LEVEL=0`` shows every line when someone debugs the profiler; empty is kineto's
    default (it reads an empty value as unset)."""
    if before is None:
        monkeypatch.delenv(KINETO_LOG_ENV, raising=False)
    else:
        monkeypatch.setenv(KINETO_LOG_ENV, before)
    quiet_kineto_logs()
    assert os.environ[KINETO_LOG_ENV] == after


def test_the_level_is_above_every_kineto_severity() -> None:
    # VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5 (torch 2.14): 5 no longer silences
    assert int(KINETO_LOG_OFF) > 5
    assert kernel_environ() == {KINETO_LOG_ENV: KINETO_LOG_OFF}


def test_the_image_and_the_lab_launcher_give_every_kernel_the_level(
        monkeypatch: pytest.MonkeyPatch) -> None:
    instructions = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    env = [word for line in instructions if line.startswith("ENV ") for word in line.split()]
    assert f"{KINETO_LOG_ENV}={KINETO_LOG_OFF}" in env

    from course_tools import lab

    started = {}

    def execv(path: str, args: list[str]) -> None:
        started.update(os.environ)

    monkeypatch.delenv(KINETO_LOG_ENV, raising=False)
    monkeypatch.setattr(lab.os, "execv", execv)
    monkeypatch.setattr(sys, "argv", ["lab", "--no-browser"])
    lab.main()
    assert started[KINETO_LOG_ENV] == KINETO_LOG_OFF


CUDA_HOME_IMPORT = "import torch.utils.cpp_extension"


def _cuda_home_stderr(tmp_path, quiet: bool) -> str:
    """stderr of a fresh interpreter that imports cpp_extension (as torch.compile's C++ backend
    does) with a CUDA toolkit in CUDA_HOME, after importing amp_tutorial or not."""
    code = ("import amp_tutorial\n" if quiet else "") + CUDA_HOME_IMPORT
    env = dict(os.environ, CUDA_HOME=str(tmp_path), PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, cwd=ROOT).stderr


def test_cpp_extensions_cuda_home_notice_is_filtered_and_nothing_else(tmp_path):
    """Lesson 14 showed "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'" in a red box
    on a machine with a CUDA toolkit and no GPU. Without amp_tutorial the notice prints (so the
    test can fail); with it, it does not, and the logger's other warnings still show."""
    import logging

    import torch

    from amp_tutorial.profiler_logs import CUDA_HOME_LOGGER, log_noise_lines

    if torch.version.cuda is None or torch.cuda.is_available():
        pytest.skip("the notice comes from a CUDA build of torch on a machine without a GPU")
    plain = _cuda_home_stderr(tmp_path, quiet=False)
    assert f"No CUDA runtime is found, using CUDA_HOME='{tmp_path}'" in plain
    assert log_noise_lines(plain)  # the nbval run would fail a cell that showed it
    assert _cuda_home_stderr(tmp_path, quiet=True) == ""
    logger = logging.getLogger(CUDA_HOME_LOGGER)
    kept = logging.LogRecord(CUDA_HOME_LOGGER, logging.WARNING, __file__, 0, "another %s",
                             ("warning",), None)
    assert logger.filter(kept)  # only the one notice is dropped
