"""The lessons' metadata (course_tools.catalogue): present in every lesson, the README's table made
from it, and a measured time written back without touching the rest of the file."""

import shutil

import jupytext
import pytest

from course_tools.catalogue import (
    MEMORY_PRESET,
    TRACKS,
    WORKSHOP_DAY_MINUTES,
    LearnerTime,
    find_lessons,
    format_hours,
    format_minutes,
    learner_time,
    number_ranges,
    read_lesson,
    record_learner_minutes,
    record_minutes,
    run_time_table,
    track_minutes,
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


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_every_lesson_has_a_track_and_its_counted_learner_time(lesson):
    """The header's learner minutes are what the model counts in the lesson as it is now: after a
    lesson changes, `python -m course_tools.catalogue learner-time --record`."""
    assert lesson.track in TRACKS, f"{lesson.name}: track {lesson.track!r}, not one of {TRACKS}"
    assert lesson.learner_minutes == learner_time(lesson.path).minutes, (
        f"{lesson.name}: the header says {lesson.learner_minutes} min, the lesson counts "
        f"{learner_time(lesson.path).minutes}: run `python -m course_tools.catalogue "
        "learner-time --record`")


def test_the_core_track_fits_a_workshop_day_and_starts_the_course():
    minutes = track_minutes(LESSONS)
    assert 0 < minutes["core"] <= WORKSHOP_DAY_MINUTES, minutes
    core = [lesson.number for lesson in LESSONS if lesson.track == "core"]
    assert core[:3] == ["01", "02", "03"], core  # the day starts where the course does


def test_learner_time_counts_prose_code_exercises_and_quiz_questions(tmp_path):
    lesson = tmp_path / "01_x.py"
    lesson.write_text(
        "# %% [markdown]\n# # 01 · X\n#\n" + "# " + "word " * 296 + "\n\n"
        "# %%\n# a comment line is not code\nx = 1\n\ny = 2\n\n"
        '# %% tags=["exercise"] solution="thing.py"\ndef f():\n    pass\n\n'
        '# %% tags=["exercise"] solution="quiz_answers.py"\n'
        "answers = {1: None, 2: None, 3: None}\n")
    counted = learner_time(lesson)
    assert counted == LearnerTime(words=300, code_lines=5, exercises=1, quiz_questions=3)
    assert counted.minutes == 35  # 2 + 0.6 + 25 + 3 = 30.6 min, rounded up to 5


def test_recording_learner_minutes_changes_only_the_header(tmp_path):
    lesson = LESSONS[-1]
    copy = tmp_path / lesson.path.name
    shutil.copy(lesson.path, copy)
    copy.write_text(copy.read_text().replace("learner_minutes:", "learner_minutes_was:"))
    assert record_learner_minutes(copy) == learner_time(lesson.path).minutes
    assert read_lesson(copy).learner_minutes == learner_time(lesson.path).minutes
    body = lesson.path.read_text().split("# ---\n", 2)[2]
    assert copy.read_text().split("# ---\n", 2)[2] == body


def test_hours_are_shown_as_people_read_them():
    assert format_hours(350) == "5 h 50 min"
    assert format_hours(65) == "1 h 05 min"
    assert format_hours(45) == "45 min"


def test_readme_names_each_lessons_track_and_time_and_each_tracks_hours():
    readme = (ROOT / "README.md").read_text()
    for lesson in LESSONS:
        row = next(line for line in readme.splitlines()
                   if line.startswith(f"| {lesson.number} | [") and lesson.path.name in line)
        assert f"| {lesson.track} | {format_hours(lesson.learner_minutes)} |" in row, row
    first_screen = readme.split("## Start on your machine")[0]
    for track, minutes in track_minutes(LESSONS).items():
        numbers = number_ranges([lesson.number for lesson in LESSONS if lesson.track == track])
        said = f"**{track} track** (lessons {numbers}: {format_hours(minutes)}"
        assert said in " ".join(first_screen.split()), f"README's first screen should say {said}"


def test_lesson_numbers_are_listed_as_ranges():
    assert number_ranges(["01", "02", "03", "04", "05", "06", "18"]) == "01-06 and 18"
    assert number_ranges(["07", "08", "09", "11", "13", "14"]) == "07-09, 11 and 13-14"
    assert number_ranges(["03"]) == "03"
