"""Run the py:percent notebooks in notebooks/ under nbval, one test per code cell.

nbval only collects ``.ipynb``; this reads each ``notebooks/NN_*.py`` with jupytext instead, so the
test ids keep the ``.py`` path (``notebooks/03_amp_training.py::Cell 4``) and the kernel starts in
notebooks/. Outputs are not compared (the text notebooks store none): the cells assert what they
teach. Notebooks run at the ``smoke`` preset unless AMP_TUTORIAL_PRESET is set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from unittest import mock

import jupytext
import nbval.plugin
import pytest

NOTEBOOK_NAME = re.compile(r"^\d\d_\w+\.py$")


def is_notebook(path: Path) -> bool:
    return path.parent.name == "notebooks" and bool(NOTEBOOK_NAME.match(path.name))


class JupytextNotebook(nbval.plugin.IPyNbFile):
    """nbval's notebook collector, fed by jupytext instead of nbformat."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compare_outputs = False

    def collect(self):
        notebook = jupytext.read(self.path)
        with mock.patch.object(nbval.plugin.nbformat, "read", return_value=notebook):
            items = list(super().collect())
        yield from items


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("AMP_TUTORIAL_PRESET", "smoke")  # inherited by the notebook kernels
    os.environ.setdefault("MPLBACKEND", "agg")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".py" and is_notebook(file_path):
        return JupytextNotebook.from_parent(parent, path=file_path)
    return None
