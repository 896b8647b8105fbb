"""course_tools.pairing: the contents manager the lab's open and save requests run (in-process
here; tests/e2e/test_lab.py asks a real server). Lessons pair with an .ipynb that keeps outputs,
the .py stays byte for byte, and a broken .ipynb never locks a learner out nor is deleted.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from course_tools.catalogue import lesson_paths
from course_tools.pairing import NOTE_KEY, CourseContentsManager
from tests.support import NOTEBOOKS

LESSON = "01_autocast_basics.py"


@pytest.fixture
def course(tmp_path: Path) -> Path:
    shutil.copy(NOTEBOOKS / LESSON, tmp_path / LESSON)
    shutil.copy(NOTEBOOKS / "jupytext.toml", tmp_path / "jupytext.toml")
    return tmp_path


def call(root: Path, method: str, *args, **kwargs):
    return asyncio.run(getattr(CourseContentsManager(root_dir=str(root)), method)(*args, **kwargs))


def save_with_output(root: Path, text: str = "a table\n") -> dict:
    model = call(root, "get", LESSON)
    first = next(c for c in model["content"]["cells"] if c["cell_type"] == "code")
    first["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    call(root, "save", {"type": "notebook", "format": "json", "content": model["content"]},
         LESSON)
    return model


def first_outputs(model: dict) -> list:
    return next(c for c in model["content"]["cells"] if c["cell_type"] == "code")["outputs"]


@pytest.mark.parametrize("config", ["jupytext.toml", "the manager's default"])
def test_a_save_keeps_outputs_in_the_pair_and_leaves_the_lesson_as_it_was(course, config):
    if config != "jupytext.toml":
        (course / "jupytext.toml").unlink()
    before = (course / LESSON).read_bytes()
    save_with_output(course)
    assert (course / LESSON).read_bytes() == before, "a save without edits changed the .py"
    assert (course / "01_autocast_basics.ipynb").exists()
    assert first_outputs(call(course, "get", LESSON))[0]["text"] == "a table\n"


def test_a_broken_ipynb_is_kept_renamed_and_the_lesson_opens_with_a_note(course):
    save_with_output(course)
    ipynb = course / "01_autocast_basics.ipynb"
    ipynb.write_text(ipynb.read_text()[:200])  # truncated (a full disk, a killed copy)
    truncated = ipynb.read_text()
    model = call(course, "get", LESSON)
    note = model["content"]["cells"][0]
    assert note["metadata"][NOTE_KEY] and "could not be read" in note["source"]
    assert first_outputs(model) == [], "the lesson opened from its .py"
    kept = list(course.glob("01_autocast_basics.ipynb.broken-*"))
    assert len(kept) == 1 and kept[0].read_text() == truncated, "the broken file must be kept"
    assert kept[0].name in note["source"]

    before = (course / LESSON).read_bytes()
    call(course, "save", {"type": "notebook", "format": "json", "content": model["content"]},
         LESSON)
    assert (course / LESSON).read_bytes() == before, "the note was saved into the lesson"
    reopened = call(course, "get", LESSON)["content"]["cells"]
    assert not any(c["metadata"].get(NOTE_KEY) for c in reopened)


def test_an_uploaded_ipynb_without_a_py_opens_as_it_is(course):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    notebook.cells[0].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"},
                                                        execution_count=1)]
    (course / "mine.ipynb").write_text(json.dumps(notebook))
    cells = call(course, "get", "mine.ipynb")["content"]["cells"]
    assert cells[0]["source"] == "1 + 1" and cells[0]["outputs"][0]["data"] == {"text/plain": "2"}


def test_a_broken_ipynb_opened_by_itself_is_reported_not_renamed(course):
    (course / "mine.ipynb").write_text("{")
    with pytest.raises(Exception, match="Unreadable Notebook"):
        call(course, "get", "mine.ipynb")
    assert (course / "mine.ipynb").read_text() == "{"


@pytest.mark.parametrize("path", lesson_paths(NOTEBOOKS), ids=lambda p: p.name)
def test_saving_a_paired_lesson_with_outputs_rewrites_no_byte_of_it(path, tmp_path):
    """test_notebooks checks jupytext's writer; this saves through the lab's manager, paired."""
    shutil.copy(path, tmp_path / path.name)
    shutil.copy(NOTEBOOKS / "jupytext.toml", tmp_path / "jupytext.toml")
    model = call(tmp_path, "get", path.name)
    for cell in model["content"]["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    call(tmp_path, "save", {"type": "notebook", "format": "json", "content": model["content"]},
         path.name)
    assert (tmp_path / path.name).read_bytes() == path.read_bytes()
    assert (tmp_path / path.with_suffix(".ipynb").name).exists()


def test_every_server_in_the_course_environment_gets_this_manager():
    """The wheel data's server config (a plain `jupyter lab`, the image's hub servers) names it,
    and jupytext's server extension keeps a class that already pairs (it has `formats`)."""
    from tests.support import ROOT

    config = ROOT / "jupyter-config/etc/jupyter/jupyter_server_config.d/amp_tutorial.json"
    name = json.loads(config.read_text())["ServerApp"]["contents_manager_class"]
    assert name == f"{CourseContentsManager.__module__}.{CourseContentsManager.__name__}"
    assert CourseContentsManager(root_dir="/").formats == "ipynb,py:percent"
