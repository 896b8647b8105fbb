"""Run the py:percent notebooks in notebooks/ under nbval, one test per code cell.

nbval only collects ``.ipynb``; this reads each ``notebooks/NN_*.py`` with jupytext instead, so the
test ids keep the ``.py`` path (``notebooks/03_amp_training.py::Cell 4``) and the kernel starts in
notebooks/. Outputs are not compared (the text notebooks store none): the cells assert what they
teach. Notebooks run at the ``smoke`` preset unless AMP_TUTORIAL_PRESET is set.

Each lesson runs in two dtype modes on every supported torch release: the lock's (this
interpreter; ids ``::auto::`` and ``::fp16::``) and each of ``amp_tutorial.versions.OTHER_TORCHES``
in its overlay venv (``tests/support/torch_envs.py``; ids ``::torch2.9.0-auto::`` ...).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from unittest import mock

import ipykernel.kernelspec
import jupytext
import nbval.plugin
import pytest

from amp_tutorial import versions
from amp_tutorial.device import DTYPE_ENV
from course_tools import answers
from course_tools.catalogue import is_lesson
from tests.support import missing_tool, torch_envs

ROOT = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"


def is_notebook(path: Path) -> bool:
    """A lesson of this checkout's course folder (course_tools.catalogue says what a lesson is)."""
    return path.resolve().parent == NOTEBOOKS and is_lesson(path)


# mode -> AMP_TUTORIAL_DTYPE for the lesson's kernel (None: unset, the device's own order)
DTYPE_MODES = {"auto": None, "fp16": "float16"}


def torch_configs() -> list[tuple[str, str | None]]:
    """(id prefix, torch release) per torch the lessons run on: the lock's (this interpreter),
    then each other supported release in its overlay (tests/support/torch_envs.py)."""
    return [("", None)] + [(f"torch{v}-", v) for v in versions.OTHER_TORCHES]


class Lesson(pytest.File):
    """One lesson, collected once per torch release and dtype mode."""

    def collect(self):
        for prefix, torch_version in torch_configs():
            for mode, dtype in DTYPE_MODES.items():
                name = f"{prefix}{mode}"
                yield JupytextNotebook.from_parent(self, path=self.path, name=name,
                                                   nodeid=f"{self.nodeid}::{name}", dtype=dtype,
                                                   torch_version=torch_version)


class JupytextNotebook(nbval.plugin.IPyNbFile):
    """nbval's notebook collector, fed by jupytext instead of nbformat; its kernel starts with
    ``AMP_TUTORIAL_DTYPE`` set to ``dtype`` (or unset), in the overlay of ``torch_version``
    (None: this interpreter, the lock's torch)."""

    def __init__(self, *args, dtype: str | None = None, torch_version: str | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compare_outputs = False
        self.dtype = dtype
        self.torch_version = torch_version

    def setup(self) -> None:
        # the kernel inherits this process's environment when it starts, and keeps it
        with mock.patch.dict(os.environ), self.kernel_interpreter():
            os.environ.pop(DTYPE_ENV, None)
            if self.dtype is not None:
                os.environ[DTYPE_ENV] = self.dtype
            super().setup()

    def kernel_interpreter(self):
        """Start the kernel with the overlay's Python (nbval's "current env" kernel otherwise)."""
        if self.torch_version is None:
            return contextlib.nullcontext()
        python = torch_envs.overlay_python(self.torch_version)
        if python is None:
            missing_tool(f"the torch {self.torch_version} test environment is not built",
                         "run `pdm run python -m tests.support.torch_envs` (pip, about 7 GB each)")
        os.environ.update(torch_envs.overlay_environ(self.torch_version))
        spec = ipykernel.kernelspec.get_kernel_dict()
        spec["argv"] = [str(python), *spec["argv"][1:]]
        return mock.patch.object(ipykernel.kernelspec, "get_kernel_dict", return_value=spec)

    def collect(self):
        notebook = jupytext.read(self.path)
        use_solutions(notebook)
        with mock.patch.object(nbval.plugin.nbformat, "read", return_value=notebook):
            items = list(super().collect())
        yield from items


# --- exercises: run each exercise notebook with the reference solution in place ----------------
# A learner's cell is marked `# %% tags=["exercise"] solution="NAME.py"`; the test run swaps in
# solutions/NAME.py (course_tools.answers, shared with the handout), so the learner sees the stub
# while nbval checks the notebook with the answer.
SOLUTIONS = ROOT / "solutions"


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup``: a lesson's cells in one configuration
    (torch release and dtype mode) stay in order on one worker, while its six configurations
    spread over the workers; every other test file keeps to one worker, as ``loadfile`` did
    (its module-scoped fixtures start a lab, an image or a hub once)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        notebook = item.getparent(JupytextNotebook)
        group = notebook.nodeid if notebook is not None else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
