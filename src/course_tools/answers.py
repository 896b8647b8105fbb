"""Exercise cells and their reference answers, swapped in wherever a lesson must run to the end.

A cell the learner writes is tagged ``# %% tags=["exercise"] solution="NAME.py"``, and
``amp_tutorial/exercises/solutions/NAME.py`` holds the reference answer. The test run (the root
``conftest.py``, under nbval) and the handout (``course_tools.handout``) both execute the lessons
with the answers in place; the learner's copy keeps the stub.
"""

from __future__ import annotations

from pathlib import Path

from nbformat import NotebookNode

EXERCISE_TAG = "exercise"


class MissingSolutionError(ValueError):
    """An exercise cell names no solution file, or one that does not exist."""


def is_exercise(cell: NotebookNode) -> bool:
    return EXERCISE_TAG in cell.metadata.get("tags", [])


def use_solutions(notebook: NotebookNode, solutions: Path) -> dict[int, str]:
    """Put each exercise cell's reference answer in place; return ``{cell index: learner source}``.

    ``solutions`` is the folder of the answer files. The returned sources let a caller show the
    learner's cell again after running the notebook with the answers.
    """
    learner = {}
    for index, cell in enumerate(notebook.cells):
        if not is_exercise(cell):
            continue
        name = cell.metadata.get("solution")
        if not name or not (solutions / name).is_file():
            raise MissingSolutionError(
                f"exercise cell needs solution=\"NAME.py\" naming a file in {solutions}; "
                f"got {name!r}")
        learner[index] = cell.source
        cell.source = (solutions / name).read_text()
    return learner
