"""Run the py:percent notebooks in notebooks/ under nbval, one test per code cell.

nbval only collects ``.ipynb``; this reads each ``notebooks/NN_*.py`` with jupytext instead, so the
test ids keep the ``.py`` path (``notebooks/03_amp_training.py::Cell 4``) and the kernel starts in
notebooks/. Outputs are not compared (the text notebooks store none): the cells assert what they
teach. Notebooks run at the ``smoke`` preset unless AMP_TUTORIAL_PRESET is set.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import jupytext
import nbval.plugin
import pytest

from amp_tutorial.device import DTYPE_ENV
from course_tools import answers
from course_tools.catalogue import is_lesson

ROOT = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"


def is_notebook(path: Path) -> bool:
    """A lesson of this checkout's course folder (course_tools.catalogue says what a lesson is)."""
    return path.resolve().parent == NOTEBOOKS and is_lesson(path)


# mode -> AMP_TUTORIAL_DTYPE for the lesson's kernel (None: unset, the device's own order)
DTYPE_MODES = {"auto": None, "fp16": "float16"}


class Lesson(pytest.File):
    """One lesson, collected once per dtype mode."""

    def collect(self):
        for mode, dtype in DTYPE_MODES.items():
            yield JupytextNotebook.from_parent(self, path=self.path, name=mode,
                                               nodeid=f"{self.nodeid}::{mode}", dtype=dtype)


class JupytextNotebook(nbval.plugin.IPyNbFile):
    """nbval's notebook collector, fed by jupytext instead of nbformat; its kernel starts with
    ``AMP_TUTORIAL_DTYPE`` set to ``dtype`` (or unset)."""

    def __init__(self, *args, dtype: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compare_outputs = False
        self.dtype = dtype

    def setup(self) -> None:
        # the kernel inherits this process's environment when it starts, and keeps it
        with mock.patch.dict(os.environ):
            os.environ.pop(DTYPE_ENV, None)
            if self.dtype is not None:
                os.environ[DTYPE_ENV] = self.dtype
            super().setup()

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
