"""amp_tutorial.progress: the learner's record of graded checks, written, read back and counted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from amp_tutorial import progress
from amp_tutorial.progress import (
    attempts_path,
    progress_table,
    read_attempts,
    record_attempt,
    show_progress,
)
from tests.support import read_only


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(progress.WORKSPACE_ENV, str(tmp_path))
    return tmp_path


def test_the_path_is_the_workspace_or_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(progress.WORKSPACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert attempts_path() == tmp_path / ".amp_tutorial" / "attempts.jsonl"
    monkeypatch.setenv(progress.WORKSPACE_ENV, str(tmp_path / "elsewhere"))
    assert attempts_path() == tmp_path / "elsewhere" / ".amp_tutorial" / "attempts.jsonl"


def test_a_record_is_written_and_read_back(workspace: Path) -> None:
    long_message = "1 problem(s) found:\n  1. " + "word " * 100
    written = record_attempt("01", "autocast_settings", False, {"b-key", "a-key"}, long_message)
    assert written is not None
    assert read_attempts() == [written]
    line = json.loads(attempts_path().read_text().splitlines()[0])
    assert set(line) == {"id", "time", "lesson", "exercise", "passed", "keys", "message"}
    assert line["keys"] == ["a-key", "b-key"] and line["passed"] is False
    assert len(line["message"]) == progress.MESSAGE_CHARS and "\n" not in line["message"]
    assert line["time"].endswith("+00:00") and len(line["id"]) == 32
    second = record_attempt("01", "autocast_settings", True, [], "All checks passed.")
    assert second is not None and second["id"] != written["id"]
    assert [r["passed"] for r in read_attempts()] == [False, True]


@pytest.fixture
def blocker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace below a regular file: it cannot hold a folder, even for root (who ignores
    chmod)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(progress.WORKSPACE_ENV, str(blocker))
    return blocker


def test_an_unwritable_folder_prints_one_line_and_returns_none(
    blocker: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert record_attempt("05", "save_and_load", True, [], "All checks passed.") is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "not recorded" in out and str(blocker) in out
    assert "Traceback" not in out
    assert read_attempts() == []


def test_a_read_only_folder_prints_one_line(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = workspace / ".amp_tutorial"
    folder.mkdir()
    undo = read_only(folder)  # as a volume mounted :ro (a bind mount for root)
    try:
        assert not os.access(folder, os.W_OK) or os.geteuid() == 0
        assert record_attempt("06", "train_with_amp", False, ["x"], "message") is None
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and "not recorded" in out
    finally:
        undo()
    assert read_attempts() == []


def test_a_truncated_or_corrupt_line_is_skipped(workspace: Path) -> None:
    first = record_attempt("02", "fp16_step", False, ["k"], "m")
    with attempts_path().open("a") as file:
        file.write('{"id": "cut", "lesson": "02", "exer\n')  # a write cut short
        file.write("[1, 2]\n\n")
    last = record_attempt("02", "fp16_step", True, [], "ok")
    assert read_attempts() == [first, last]
    assert read_attempts(workspace / "missing.jsonl") == []


def test_the_table_counts_attempts_and_any_pass(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for lesson, exercise, passed in [
        ("06", "train_with_amp", False),
        ("01", "autocast", False),
        ("06", "train_with_amp", True),
        ("06", "train_with_amp", False),
    ]:
        record_attempt(lesson, exercise, passed, [], "")
    rows = progress_table(read_attempts())
    assert rows == [("01", "autocast", False, 1), ("06", "train_with_amp", True, 3)]
    show_progress()
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["lesson", "exercise", "passed", "attempts"]
    assert out[2].split() == ["06", "train_with_amp", "yes", "3"]


def test_no_attempts_says_so(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    show_progress()
    assert "No attempts recorded yet" in capsys.readouterr().out


def test_every_graded_check_records_an_attempt(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from amp_tutorial.exercises.autocast_settings import check_autocast_settings
    from amp_tutorial.quiz import ADVANCED_QUIZ, CORE_QUIZ

    quiz = CORE_QUIZ.check({1: "b"})
    result = check_autocast_settings(lambda device: (device.type, "bf16", False))
    advanced = ADVANCED_QUIZ.check({n: q.answer for n, q in ADVANCED_QUIZ.questions.items()})
    not_a_dict = CORE_QUIZ.check(["b"])
    quiz_record, check_record, advanced_record, not_a_dict_record = read_attempts()
    assert (quiz_record["lesson"], quiz_record["exercise"], quiz_record["passed"]) == (
        "06",
        "quiz",
        False,
    )
    assert (
        "question-1-correct" not in quiz_record["keys"]
        and "question-1-wrong" not in quiz_record["keys"]  # 1: "b" is right
        and "question-2-unanswered" in quiz_record["keys"]
        and quiz_record["message"] == str(quiz).splitlines()[0]
    )
    assert (check_record["lesson"], check_record["exercise"]) == ("01", "autocast_settings")
    assert check_record["keys"] == sorted(result.keys) and not check_record["passed"]
    assert check_record["message"] == " ".join(str(result).split())[: progress.MESSAGE_CHARS]
    # each quiz under its own lesson; all right passes with no keys
    assert (advanced_record["lesson"], advanced_record["exercise"]) == ("17", "quiz")
    assert advanced_record["passed"] and advanced_record["keys"] == [] and advanced.all_correct
    assert advanced_record["message"] == f"Score: {len(ADVANCED_QUIZ.questions)} / " + (
        f"{len(ADVANCED_QUIZ.questions)}")
    assert not_a_dict_record["keys"] == ["answers-not-a-dict"] and not not_a_dict.all_correct
    assert capsys.readouterr().out == ""


def test_a_check_answers_as_usual_when_it_cannot_record(
    blocker: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from amp_tutorial.quiz import CORE_QUIZ

    quiz = CORE_QUIZ.check({})
    assert quiz.score == 0 and len(quiz.marks) == len(CORE_QUIZ.questions)
    assert capsys.readouterr().out.count("not recorded") == 1
