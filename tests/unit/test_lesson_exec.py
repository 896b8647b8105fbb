"""course_tools.lesson_exec: a py:percent lesson read into code cells and run without Jupyter,
as the GPU machine (no jupytext, nbclient or IPython) runs the course."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_tools.gpu_check import ROOT
from course_tools.lesson_exec import LessonFormatError, read_cells

LESSON = '''# ---
# jupyter:
#   kernelspec:
#     name: python3
# ---

# %% [markdown]
# # 01 · A lesson
# x = "markdown is not run"

# %%
from IPython.display import Markdown, display
import matplotlib.pyplot as plt
value = 2

# %% tags=["exercise"] solution="answer.py"
raise NotImplementedError("the learner's stub")

# %%
fig, ax = plt.subplots()
assert answer() == 4, "the reference answer replaced the stub"
display(Markdown("**shown**"))
value * 21

# %%
assert value == 3, f"value is {value}"

# %% tags=["raises-exception"]
1 / 0

# %%
print("after", value)
'''


@pytest.fixture
def course(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "answer.py").write_text("def answer():\n    return value * 2\n")
    lesson = tmp_path / "notebooks" / "01_lesson.py"
    lesson.write_text(LESSON)
    return lesson


def test_read_cells_skips_the_header_and_markdown_and_swaps_in_answers(course: Path) -> None:
    cells = read_cells(course, course.parent.parent / "solutions")
    assert [c.number for c in cells] == [1, 2, 3, 4, 5, 6]
    assert cells[0].first_line == "from IPython.display import Markdown, display"
    assert cells[1].source.startswith("def answer():") and cells[1].solution == "answer.py"
    assert "markdown is not run" not in "".join(c.source for c in cells)
    assert cells[4].tags == ["raises-exception"]


def test_an_exercise_without_its_answer_file_is_named(course: Path) -> None:
    (course.parent.parent / "solutions" / "answer.py").unlink()
    with pytest.raises(LessonFormatError, match="answer.py"):
        read_cells(course, course.parent.parent / "solutions")


def test_every_cell_runs_in_one_namespace_and_the_first_error_is_the_verdict(
        course: Path, tmp_path: Path) -> None:
    result_path = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "course_tools.lesson_exec", str(course),
                           str(result_path), str(course.parent.parent / "solutions")],
                          cwd=course.parent, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")},
                          timeout=300, check=False)
    result = json.loads(result_path.read_text())
    assert done.returncode == 1, done.stderr
    statuses = [c["status"] for c in result["cells"]]
    assert statuses == ["passed", "passed", "passed", "failed", "passed", "passed"], result
    assert result["first_error"] == {"cell": 4, "first_line": "assert value == 3, f\"value is "
                                     "{value}\"", "error": "AssertionError: value is 2"}
    assert result["finished"] and result["max_memory_allocated"] is None  # no GPU here
    assert "**shown**" in done.stdout and "42" in done.stdout  # display and the last expression
    assert "after 2" in done.stdout  # cells after a failure still run
