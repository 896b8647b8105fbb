"""The learner's own record of every graded check: one JSON line per attempt, in the workspace.

Each exercise checker and the quiz call :func:`record_attempt` once per check. A record says which
lesson and exercise, whether it passed, the problem keys and the first words of what the checker
said, and when; never the learner's code or outputs. The file is
``<workspace>/.amp_tutorial/attempts.jsonl``, the workspace being ``$AMP_TUTORIAL_WORKSPACE`` or the
current directory (the kernel's folder, where the lessons are), so it works under ``pdm run lab``,
compose and the hub alike. Recording never breaks or slows a check: when the file cannot be
written (a read-only folder, a full disk) one plain line says so and the check answers as usual.
:func:`show_progress` prints the learner's table. On the workshop hub each new record is also sent,
in the background, to the class's progress service (:mod:`amp_tutorial.class_sync`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from amp_tutorial.class_sync import sync_in_background

WORKSPACE_ENV = "AMP_TUTORIAL_WORKSPACE"
FOLDER = ".amp_tutorial"
FILE = "attempts.jsonl"
MESSAGE_CHARS = 200  # the first words of what the checker said, not the whole report


def attempts_path() -> Path:
    """Where this workspace's attempts are recorded (the file may not exist yet)."""
    workspace = os.environ.get(WORKSPACE_ENV) or os.getcwd()
    return Path(workspace) / FOLDER / FILE


def record_attempt(
    lesson: str, exercise: str, passed: bool, keys: Iterable[str], message: str
) -> dict[str, Any] | None:
    """Append one attempt and return it; on any failure print one line and return None."""
    record = {
        "id": uuid.uuid4().hex,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "lesson": str(lesson),
        "exercise": str(exercise),
        "passed": bool(passed),
        "keys": sorted(str(k) for k in keys),
        "message": " ".join(str(message).split())[:MESSAGE_CHARS],
    }
    path = attempts_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
    except Exception as error:  # noqa: BLE001 - recording must never break a check
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        print(f"(This attempt was not recorded in {path}: {reason}.)")
        return None
    sync_in_background(path)  # on the workshop hub: to the class's progress (never raises)
    return record


def read_attempts(path: Path | str | None = None) -> list[dict[str, Any]]:
    """Every attempt recorded at ``path`` (default: :func:`attempts_path`), oldest first.

    A line that is not a complete JSON record (a write cut short by a full disk) is skipped.
    """
    path = Path(path) if path is not None else attempts_path()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and {"lesson", "exercise", "passed"} <= record.keys():
            records.append(record)
    return records


def progress_table(records: Sequence[dict[str, Any]]) -> list[tuple[str, str, bool, int]]:
    """One row per (lesson, exercise), in lesson order: passed at least once, and attempts."""
    rows: dict[tuple[str, str], list[Any]] = {}
    for record in records:
        row = rows.setdefault((str(record["lesson"]), str(record["exercise"])), [False, 0])
        row[0] = row[0] or bool(record["passed"])
        row[1] += 1
    return [
        (lesson, exercise, passed, attempts)
        for (lesson, exercise), (passed, attempts) in sorted(rows.items())
    ]


def show_progress(path: Path | str | None = None) -> None:
    """Print the learner's progress: lesson, exercise, passed, attempts."""
    rows = progress_table(read_attempts(path))
    if not rows:
        print(f"No attempts recorded yet in {Path(path) if path else attempts_path()}.")
        return
    width = max(len(exercise) for _, exercise, _, _ in rows)
    print(f"lesson  {'exercise':<{width}}  passed  attempts")
    for lesson, exercise, passed, attempts in rows:
        print(f"{lesson:<6}  {exercise:<{width}}  {'yes' if passed else 'no':<6}  {attempts}")
