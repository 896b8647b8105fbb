"""The lessons' metadata (course_tools.catalogue): present in every lesson, the README's table made
from it, and a measured time written back without touching the rest of the file."""

import shutil

import jupytext
import pytest

from course_tools.catalogue import (
    MEMORY_PRESET,
    find_lessons,
    format_minutes,
    read_lesson,
    record_minutes,
    run_time_table,
)
from tests.support import NOTEBOOKS, ROOT

LESSONS = find_lessons(NOTEBOOKS)


def test_every_lesson_is_found_with_its_number_and_title():
    # every .py file of the course folder but the template is a lesson, in course order
    assert [lesson.path for lesson in LESSONS] == sorted(
        path for path in NOTEBOOKS.glob("*.py") if path.name != "_template.py")
    for lesson in LESSONS:
        assert lesson.number == lesson.path.name[:2]
        assert lesson.title and "·" not in lesson.title


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_every_lesson_says_its_run_time_and_what_it_needs(lesson):
    """Every lesson has a measured `smoke` time (the test suite's size); other presets' times are
    positive where given (the README says "not measured" elsewhere)."""
    assert lesson.minutes.get("smoke", 0) > 0, f"{lesson.name}: no measured smoke time"
    assert set(lesson.minutes) <= {"smoke", "small", "cpu", "paper"}, lesson.minutes
    assert all(minutes > 0 for minutes in lesson.minutes.values()), lesson.minutes
    assert lesson.needs.startswith(("any device", "2 processes")), lesson.needs


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_every_lesson_says_the_memory_it_needs_at_paper(lesson):
    """The peak of live tensor memory at the GPU's sizes, in whole MiB, as
    `python -m course_tools.memory --record` wrote it."""
    assert lesson.memory.get(MEMORY_PRESET, 0) > 0, f"{lesson.name}: no measured memory"
    figures = [*lesson.memory.values(), *lesson.process_memory.values()]
    assert all(isinstance(mib, int) and mib > 0 for mib in figures), figures


def test_readme_table_is_made_from_the_lessons_metadata():
    """The README's run-time table is `python -m course_tools.catalogue table`, row for row."""
    assert run_time_table(LESSONS) in (ROOT / "README.md").read_text()


def test_recording_a_time_changes_only_the_header(tmp_path):
    lesson = LESSONS[0]
    copy = tmp_path / lesson.path.name
    shutil.copy(lesson.path, copy)
    record_minutes(copy, "paper", 125)
    recorded = read_lesson(copy)
    assert recorded.minutes["paper"] == 2.1
    assert {k: v for k, v in recorded.minutes.items() if k != "paper"} == {
        k: v for k, v in lesson.minutes.items() if k != "paper"}
    body = lesson.path.read_text().split("# ---\n", 2)[2]
    assert copy.read_text().split("# ---\n", 2)[2] == body
    assert jupytext.writes(jupytext.read(copy), fmt="py:percent") == copy.read_text()


def test_minutes_are_shown_as_people_read_them():
    assert format_minutes(0.4) == "24 s"
    assert format_minutes(13.6) == "13.6 min"
    assert format_minutes(None) == "not measured"
