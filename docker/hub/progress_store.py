"""The class's exercise attempts in SQLite (read by progress_service.py and progress_view.py).

One row per attempt, keyed by (user, id): the id is the learner's own record id (a uuid4 made by
amp_tutorial.progress), so a record sent twice, by a retry or by two kernels at once, is stored
once, and one learner's ids can never block or overwrite another's. The user always comes from
the hub's answer about the token, never from the request. The file lives on the hub's volume
(/srv/jupyterhub), so the class's record survives a restart of the hub or of this service.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    user     TEXT NOT NULL,
    id       TEXT NOT NULL,
    time     TEXT NOT NULL,   -- when the learner checked, ISO 8601 UTC, from their record
    lesson   TEXT NOT NULL,
    exercise TEXT NOT NULL,
    passed   INTEGER NOT NULL,
    keys     TEXT NOT NULL,   -- the checker's problem keys, a JSON list
    message  TEXT NOT NULL,   -- the first words of what the checker said
    received TEXT NOT NULL,   -- when this service stored it, ISO 8601 UTC
    PRIMARY KEY (user, id)
);
CREATE INDEX IF NOT EXISTS attempts_by_user_time ON attempts (user, time);
"""
CSV_FIELDS = ("user", "id", "time", "lesson", "exercise", "passed", "keys", "message", "received")


@dataclass(frozen=True)
class Attempt:
    """One stored attempt, as the page and the CSV export read it."""

    user: str
    id: str
    time: str
    lesson: str
    exercise: str
    passed: bool
    keys: tuple[str, ...]
    message: str
    received: str


class Store:
    """The attempts table, shared by the service's threads (one lock, one connection)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def add(self, user: str, records: Iterable[dict], received: str) -> int:
        """Store `user`'s validated records (progress_input.parse_post); return how many were
        new. All or nothing: one transaction."""
        rows = [
            (
                user,
                r["id"],
                r["time"],
                r["lesson"],
                r["exercise"],
                int(r["passed"]),
                json.dumps(list(r["keys"])),
                r["message"],
                received,
            )
            for r in records
        ]
        with self._lock:
            before = self._db.total_changes
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return self._db.total_changes - before

    def attempts(self) -> list[Attempt]:
        """Every attempt, oldest first (by the learner's time, then by arrival)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT user, id, time, lesson, exercise, passed, keys, message, received "
                "FROM attempts ORDER BY time, received, user, id"
            ).fetchall()
        return [
            Attempt(u, i, t, lesson, ex, bool(p), tuple(json.loads(k)), m, rec)
            for u, i, t, lesson, ex, p, k, m, rec in rows
        ]

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM attempts").fetchone()[0]

    def clear(self) -> int:
        """Delete every attempt (the instructor's action after a class); return how many."""
        with self._lock:
            deleted = self._db.execute("DELETE FROM attempts").rowcount
        with self._lock:
            self._db.execute("VACUUM")  # the learners' messages leave the file too
        return deleted

    def to_csv(self) -> str:
        """Every attempt as CSV, one row each, with a header; keys joined by spaces."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_FIELDS)
        for a in self.attempts():
            writer.writerow(
                [
                    a.user,
                    a.id,
                    a.time,
                    a.lesson,
                    a.exercise,
                    "yes" if a.passed else "no",
                    " ".join(a.keys),
                    csv_safe(a.message),
                    a.received,
                ]
            )
        return out.getvalue()

    def close(self) -> None:
        with self._lock:
            self._db.close()


def csv_safe(text: str) -> str:
    """A cell a spreadsheet will not run as a formula (OWASP's CSV injection advice)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
