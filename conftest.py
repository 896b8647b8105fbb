"""Run the py:percent notebooks in notebooks/ under nbval, one test per code cell.

nbval only collects ``.ipynb``; this reads each ``notebooks/NN_*.py`` with jupytext instead, so the
test ids keep the ``.py`` path (``notebooks/03_amp_training.py::Cell 4``) and the kernel starts in
notebooks/. Outputs are not compared (the text notebooks store none): the cells assert what they
teach. Notebooks run at the ``smoke`` preset unless AMP_TUTORIAL_PRESET is set.

Each lesson runs in two dtype modes on every supported torch release: the lock's (this
interpreter; ids ``::auto::`` and ``::fp16::``) and each of ``amp_tutorial.versions.OTHER_TORCHES``
in its overlay venv (``tests/support/torch_envs.py``; ids ``::torch2.9.1-auto::`` ...), and once
more on the lock's torch as an AVX2-only CPU runs it (``::avx2-auto::``), where that changes
which kernels run (not on an AVX2-only CPU, which runs so already).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from unittest import mock

import ipykernel.kernelspec
import jupytext
import nbval.plugin
import pytest

from amp_tutorial import versions
from amp_tutorial.device import DTYPE_ENV
from amp_tutorial.exercises import solutions
from amp_tutorial.profiler_logs import KINETO_LOG_ENV, KINETO_LOG_OFF, log_noise_lines
from course_tools import answers
from course_tools.catalogue import is_lesson
from tests.support import missing_tool, torch_envs
from tests.support.cpu_emulation import AVX2_EMULATION, emulation_changes_kernels

ROOT = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"


def is_notebook(path: Path) -> bool:
    """A lesson of this checkout's course folder (course_tools.catalogue says what a lesson is)."""
    return path.resolve().parent == NOTEBOOKS and is_lesson(path)


# mode -> AMP_TUTORIAL_DTYPE for the lesson's kernel (None: unset, the device's own order)
DTYPE_MODES = {"auto": None, "fp16": "float16"}




@dataclasses.dataclass(frozen=True)
class Config:
    """One run of a lesson: its kernel's torch (None: the lock's, this interpreter), dtype mode and
    any environment that changes which CPU kernels torch picks."""

    name: str
    dtype: str | None
    torch_version: str | None = None
    env: tuple[tuple[str, str], ...] = ()


def configs() -> list[Config]:
    """Both dtype modes on every supported torch release (the lock's, then each other release in
    its overlay, tests/support/torch_envs.py), and the device's own mode under AVX2 emulation
    where that changes which kernels run (tests/support/cpu_emulation.py; not on a Zen 3)."""
    runs = [Config(mode, dtype) for mode, dtype in DTYPE_MODES.items()]
    if emulation_changes_kernels()[0]:
        runs.append(Config("avx2-auto", None, env=tuple(AVX2_EMULATION.items())))
    runs += [Config(f"torch{version}-{mode}", dtype, version)
             for version in versions.OTHER_TORCHES for mode, dtype in DTYPE_MODES.items()]
    return runs


class Lesson(pytest.File):
    """One lesson, collected once per configuration."""

    def collect(self):
        for config in configs():
            yield JupytextNotebook.from_parent(self, path=self.path, name=config.name,
                                               nodeid=f"{self.nodeid}::{config.name}",
                                               run=config)


class JupytextNotebook(nbval.plugin.IPyNbFile):
    """nbval's notebook collector, fed by jupytext instead of nbformat; its kernel starts with
    the configuration's ``AMP_TUTORIAL_DTYPE`` (or none), environment and torch."""

    def __init__(self, *args, run: Config, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compare_outputs = False
        self.run_config = run

    def setup(self) -> None:
        # the kernel inherits this process's environment when it starts, and keeps it
        with mock.patch.dict(os.environ), self.kernel_interpreter():
            os.environ.pop(DTYPE_ENV, None)
            if self.run_config.dtype is not None:
                os.environ[DTYPE_ENV] = self.run_config.dtype
            os.environ.update(dict(self.run_config.env))
            # ipykernel forwards what C++ code writes to file descriptors 1 and 2 into the cell's
            # output, as a learner's Jupyter shows it, except in a kernel started by a test
            # (ipykernel.iostream.OutStream checks PYTEST_CURRENT_TEST): a lesson runs as it would
            # for a learner
            os.environ.pop("PYTEST_CURRENT_TEST", None)
            super().setup()

    def kernel_interpreter(self):
        """Start the kernel with the overlay's Python (nbval's "current env" kernel otherwise)."""
        version = self.run_config.torch_version
        if version is None:
            return contextlib.nullcontext()
        python = torch_envs.overlay_python(version)
        if python is None:
            missing_tool(f"the torch {version} test environment is not built",
                         "run `pdm run python -m tests.support.torch_envs` (pip, about 7 GB each)")
        os.environ.update(torch_envs.overlay_environ(version))
        spec = ipykernel.kernelspec.get_kernel_dict()
        spec["argv"] = [str(python), *spec["argv"][1:]]
        return mock.patch.object(ipykernel.kernelspec, "get_kernel_dict", return_value=spec)

    def collect(self):
        notebook = jupytext.read(self.path)
        use_solutions(notebook)
        with mock.patch.object(nbval.plugin.nbformat, "read", return_value=notebook):
            items = list(super().collect())
        yield from items


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A lesson's code cell passes nbval's checks and one more: no line of the profiler's C++
    logger (kineto) in its output, where Jupyter shows it as a red stderr box that reads as a
    failure, nor cpp_extension's CUDA_HOME notice. amp_tutorial.profiler_logs keeps them out; the
    kernels inherit its kineto setting, made when this process imported amp_tutorial, and filter
    the notice when the lesson imports amp_tutorial. A line written late shows in the next cell's
    output."""
    result = yield
    if isinstance(item, nbval.plugin.IPyNbCell) and isinstance(item.parent, JupytextNotebook):
        streams = "".join(out.get("text", "") for out in item.test_outputs or ()
                          if out.get("output_type") == "stream")
        if lines := log_noise_lines(streams):
            item.raise_cell_error(
                "log lines of torch's machinery reached the cell's output (the kernel's "
                f"{KINETO_LOG_ENV} is {os.environ.get(KINETO_LOG_ENV)!r}; "
                f"amp_tutorial.profiler_logs sets {KINETO_LOG_OFF!r})", "\n".join(lines))
    return result


# --- exercises: run each exercise notebook with the reference solution in place ----------------
# A learner's cell is marked `# %% tags=["exercise"] solution="NAME.py"`; the test run swaps in
# amp_tutorial/exercises/solutions/NAME.py (course_tools.answers, shared with the handout), so the
# learner sees the stub while nbval checks the notebook with the answer.
SOLUTIONS = solutions.FOLDER


def use_solutions(notebook) -> None:
    """Replace the source of every cell tagged ``exercise`` with the solution file it names."""
    try:
        answers.use_solutions(notebook, SOLUTIONS)
    except answers.MissingSolutionError as error:
        raise pytest.UsageError(str(error)) from error
# --- end exercises -------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("AMP_TUTORIAL_PRESET", "smoke")  # inherited by the notebook kernels
    os.environ.setdefault("MPLBACKEND", "agg")


class NotAModule(pytest.File):
    """Collects nothing: a notebook named on the command line is not a Python test module."""

    def collect(self):
        return []


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    # pytest imports any .py file given as an argument; `pytest notebooks/06_x.py` must only run
    # it under nbval (pytest_collect_file below), not import it.
    if is_notebook(module_path):
        return NotAModule.from_parent(parent, path=module_path)
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".py" and is_notebook(file_path):
        return Lesson.from_parent(parent, path=file_path)
    return None
