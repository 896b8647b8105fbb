"""The lessons as files: numbered, py:percent with the python3 kernel, and stable under a save."""

import jupytext
import pytest

from tests.conftest import NOTEBOOKS

LESSONS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def test_lessons_are_numbered_in_order():
    numbers = [int(p.name[:2]) for p in LESSONS]
    assert numbers == list(range(1, len(LESSONS) + 1))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_saving_in_jupyterlab_rewrites_nothing(path):
    """JupyterLab saves through jupytext; a save without edits must leave the file as it was."""
    notebook = jupytext.read(path)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert jupytext.writes(notebook, fmt="py:percent") == path.read_text()
