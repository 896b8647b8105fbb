"""course_tools.answers: exercise cells get their reference answer; the stub is given back."""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest

from course_tools.answers import MissingSolutionError, is_exercise, use_solutions
from course_tools.catalogue import lesson_paths
from tests.support import NOTEBOOKS, SOLUTIONS


def notebook_with(cell_metadata: dict) -> nbformat.NotebookNode:
    stub = nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError",
                                     metadata=cell_metadata)
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), stub,
                                           nbformat.v4.new_code_cell("assert f() == 2")])


def test_exercise_cells_get_the_answer_and_the_stub_is_returned(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("def f():\n    return 2\n")
    notebook = notebook_with({"tags": ["exercise"], "solution": "f.py"})
    learner = use_solutions(notebook, tmp_path)
    assert learner == {1: "def f():\n    raise NotImplementedError"}
    assert notebook.cells[1].source == "def f():\n    return 2\n"
    assert [c.source for c in notebook.cells[::2]] == ["x = 1", "assert f() == 2"]  # untouched


@pytest.mark.parametrize("metadata", [{"tags": ["exercise"]},
                                      {"tags": ["exercise"], "solution": "missing.py"}])
def test_an_exercise_without_its_answer_file_is_refused(metadata: dict, tmp_path: Path) -> None:
    with pytest.raises(MissingSolutionError, match="solution=\"NAME.py\""):
        use_solutions(notebook_with(metadata), tmp_path)


def test_untagged_cells_are_left_alone(tmp_path: Path) -> None:
    notebook = notebook_with({"solution": "f.py"})  # a solution name alone is no exercise
    assert use_solutions(notebook, tmp_path) == {}
    assert not any(map(is_exercise, notebook.cells))


def test_every_exercise_in_the_course_has_its_answer() -> None:
    found = 0
    for path in lesson_paths(NOTEBOOKS):
        notebook = jupytext.read(path)
        learner = use_solutions(notebook, SOLUTIONS)
        for index, stub in learner.items():
            assert notebook.cells[index].source != stub, f"{path.name}: answer equals the stub"
        found += len(learner)
    assert found >= 1, "the course has no exercise cell any more: update this test"
