"""course_update: a newer course reaches a learner's folder; edits are never overwritten, outputs
of unchanged cells survive, and no copy leaves an .ipynb newer than its .py.

The pairs are opened with the course's own contents manager (course_tools.pairing), the code the
lab's open and save requests run, in this process.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from course_tools.course_update import (
    MANIFEST,
    NOTICE,
    Report,
    main,
    take_new_version,
    update_course,
)
from course_tools.pairing import CourseContentsManager
from tests.support import NOTEBOOKS

LESSON = "01_autocast_basics.py"
OLD = "# %%\nprint('table v1')\n\n# %%\nprint('figure')\n"
NEW = "# %%\nprint('table v2')\n\n# %%\nprint('figure')\n"


def write_course(folder: Path, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / LESSON).write_text(text)
    shutil.copy(NOTEBOOKS / "jupytext.toml", folder / "jupytext.toml")
    return folder


def run_and_save(work: Path, outputs: list[str]) -> None:
    """Give every code cell a stream output and save, as the lab's Run All then Save does."""
    async def go():
        cm = CourseContentsManager(root_dir=str(work))
        model = await cm.get(LESSON)
        code = [c for c in model["content"]["cells"] if c["cell_type"] == "code"]
        for cell, text in zip(code, outputs, strict=True):
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": text}]
        await cm.save({"type": "notebook", "format": "json", "content": model["content"]},
                      LESSON)
    asyncio.run(go())


def opened(work: Path) -> list[tuple[str, list[str]]]:
    """(source, output texts) of each code cell as the lab opens the lesson."""
    async def go():
        return await CourseContentsManager(root_dir=str(work)).get(LESSON)
    cells = asyncio.run(go())["content"]["cells"]
    return [(c["source"], [o.get("text", "") for o in c["outputs"]])
            for c in cells if c["cell_type"] == "code"]


@pytest.fixture
def learner(tmp_path: Path) -> tuple[Path, Path]:
    """The course at v1 delivered into a learner's folder, run and saved with outputs."""
    course, work = write_course(tmp_path / "course", OLD), tmp_path / "work"
    report = update_course(course, work)
    assert sorted(report.added) == [LESSON, "jupytext.toml"]
    run_and_save(work, ["v1 table\n", "a figure\n"])
    assert (work / LESSON).read_text() == OLD, "a save without edits rewrote the lesson"
    assert (work / LESSON).with_suffix(".ipynb").exists(), "no paired .ipynb was written"
    return course, work


def age(path: Path, seconds: float) -> None:
    stamp = path.stat().st_mtime - seconds
    os.utime(path, (stamp, stamp))


@pytest.mark.parametrize("order", ["course older than outputs", "course newer than outputs"])
def test_an_unedited_lesson_takes_the_new_text_and_keeps_unchanged_outputs(learner, order):
    course, work = learner
    write_course(course, NEW)
    ipynb = (work / LESSON).with_suffix(".ipynb")
    if order == "course older than outputs":  # an image built before the learner ran the lesson
        age(course / LESSON, 3600)
    else:
        age(ipynb, 3600)
    report = update_course(course, work)
    assert report.updated == [LESSON] and not report.kept_edited
    assert (work / LESSON).read_text() == NEW
    assert (work / LESSON).stat().st_mtime >= ipynb.stat().st_mtime
    # Jupytext matches cells by source: the changed cell lost its output, the unchanged kept it
    assert opened(work) == [("print('table v2')", []), ("print('figure')", ["a figure\n"])]


def test_a_copy_with_the_courses_old_time_is_what_jupytext_refuses(learner):
    """The failure the policy avoids: cp -p of the new text under the learner's newer .ipynb."""
    course, work = learner
    write_course(course, NEW)
    age(course / LESSON, 3600)
    shutil.copy2(course / LESSON, work / LESSON)  # keeps the course's older time, as cp -p does
    with pytest.raises(Exception, match="more recent than"):
        opened(work)
    assert update_course(course, work).updated == [LESSON]  # the start script repairs it
    assert opened(work) == [("print('table v2')", []), ("print('figure')", ["a figure\n"])]


def test_an_edited_lesson_is_kept_and_the_new_version_waits(learner):
    course, work = learner
    mine = OLD.replace("figure", "my figure")
    (work / LESSON).write_text(mine)
    write_course(course, NEW)
    report = update_course(course, work)
    assert report.kept_edited == [LESSON] and not report.updated
    assert (work / LESSON).read_text() == mine
    assert f"course-update take {LESSON}" in (work / NOTICE).read_text()
    assert update_course(course, work).kept_edited == [LESSON], "a restart must keep it too"
    assert (work / LESSON).read_text() == mine


def test_an_edit_alone_is_no_waiting_update(learner):
    course, work = learner
    (work / LESSON).write_text(OLD + "# %%\nmine = 1\n")
    report = update_course(course, work)
    assert report == Report() and not (work / NOTICE).exists()
    assert (work / LESSON).read_text().endswith("mine = 1\n")


def test_taking_the_new_version_keeps_the_learners_pair_beside_it(learner):
    course, work = learner
    mine = OLD.replace("figure", "my figure")
    (work / LESSON).write_text(mine)
    run_and_save(work, ["v1 table\n", "my figure\n"])
    write_course(course, NEW)
    update_course(course, work)
    kept = take_new_version(course, work, LESSON)
    assert kept.name.startswith("01_autocast_basics.mine-") and kept.read_text() == mine
    assert kept.with_suffix(".ipynb").exists(), "the learner's outputs went with their text"
    assert (work / LESSON).read_text() == NEW and not (work / NOTICE).exists()
    assert update_course(course, work).kept_edited == []


def test_a_folder_from_before_manifests_keeps_every_differing_file(tmp_path):
    """No record of what was delivered: a differing file may be the learner's edit, so it stays."""
    course, work = write_course(tmp_path / "course", NEW), tmp_path / "work"
    work.mkdir()
    (work / LESSON).write_text(OLD)
    report = update_course(course, work)
    assert report.kept_edited == [LESSON] and (work / LESSON).read_text() == OLD
    assert (work / MANIFEST).exists()


def test_outputs_and_caches_are_never_copied(tmp_path):
    course = write_course(tmp_path / "course", OLD)
    (course / "01_autocast_basics.ipynb").write_text("{}")
    (course / "__pycache__").mkdir()
    (course / "__pycache__" / "x.pyc").write_bytes(b"")
    report = update_course(course, tmp_path / "work")
    assert sorted(report.added) == [LESSON, "jupytext.toml"]


def test_the_command_takes_a_lesson(learner, capsys):
    course, work = learner
    (work / LESSON).write_text("# %%\nmine\n")
    write_course(course, NEW)
    main(["take", LESSON, "--course", str(course), "--work", str(work)])
    assert "is now the course's version" in capsys.readouterr().out
    assert (work / LESSON).read_text() == NEW
