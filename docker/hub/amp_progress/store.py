"""The class's exercise attempts in SQLite (read by the service and the view).

One row per attempt, keyed by (user, id): the id is the learner's own record id (a uuid4 made by
amp_tutorial.progress), so a record sent twice, by a retry or by two kernels at once, is stored
once, and one learner's ids can never block or overwrite another's. The user always comes from
the hub's answer about the token, never from the request. The file lives on the hub's volume
(/srv/jupyterhub), so the class's record survives a restart of the hub or of this service.

The file never stops the service, nor so the hub: `open_store` sets an unreadable file aside
(renamed `<name>.unreadable-<time>`, kept for the instructor) and starts a fresh one; when even
that fails the service runs without a store and its page says why. A file deleted while the
service runs is written back from the open connection before the next write, so attempts already
acknowledged are not lost at the next restart.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger("amp-progress")

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    user     TEXT NOT NULL,
    id       TEXT NOT NULL,
    time     TEXT NOT NULL,   -- when the learner checked, ISO 8601 UTC, clamped to our clock
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
COLUMNS = "user, id, time, lesson, exercise, passed, keys, message, received"
CSV_CHUNK = 2000  # rows per piece of the streamed CSV


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


class Full(Exception):
    """The learner already has the most rows the service keeps for one learner."""


class Store:
    """The attempts table, shared by the service's threads (one lock, one connection).

    `version` grows with every change, so a reader can keep what it computed from the table until
    the table changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.version = 0
        self._changed: dict[str, int] = {}  # user -> the version of their last change
        self._cleared_at = 0
        self._db = self._connect()
        self._inode = self._inode_now()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(SCHEMA)
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("the file failed SQLite's quick_check")
        except BaseException:
            db.close()
            raise
        return db

    def _inode_now(self) -> int | None:
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return None

    def _still_on_disk(self) -> None:
        """Write the table back to `path` if the file was deleted or replaced under us (lock held):
        the open connection still holds every acknowledged attempt."""
        if self._inode is not None and self._inode_now() == self._inode:
            return
        log.warning("%s was deleted or replaced while the service ran: writing it back", self.path)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        fresh = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.backup(fresh)
        self._db.close()
        fresh.close()
        self._db = self._connect()
        self._inode = self._inode_now()

    def add(self, user: str, records: Iterable[dict], received: str,
            max_rows: int | None = None) -> int:
        """Store `user`'s validated records (records.parse_post); return how many were new.
        All or nothing, in one transaction: raises Full (nothing stored) when the learner would
        hold more than `max_rows`."""
        rows = [
            (user, r["id"], r["time"], r["lesson"], r["exercise"], int(r["passed"]),
             json.dumps(list(r["keys"])), r["message"], received)
            for r in records
        ]
        with self._lock:
            self._still_on_disk()
            before = self._db.total_changes
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                )
                added = self._db.total_changes - before
                if added and max_rows is not None and self._count(user) > max_rows:
                    raise Full(f"{user} has {max_rows} attempts stored already")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            if added:
                self.version += 1
                self._changed[user] = self.version
            return added

    def _count(self, user: str) -> int:
        return self._db.execute("SELECT count(*) FROM attempts WHERE user = ?",
                                (user,)).fetchone()[0]

    def count_of(self, user: str) -> int:
        with self._lock:
            return self._count(user)

    def attempts(self) -> list[Attempt]:
        """Every attempt, oldest first (by the learner's time, then by arrival)."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {COLUMNS} FROM attempts ORDER BY time, received, user, id"
            ).fetchall()
        return [as_attempt(row) for row in rows]

    def attempts_of(self, user: str) -> list[Attempt]:
        """One learner's attempts (the index on (user, time) finds them)."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {COLUMNS} FROM attempts WHERE user = ? ORDER BY time", (user,)
            ).fetchall()
        return [as_attempt(row) for row in rows]

    def users(self) -> list[str]:
        with self._lock:
            return [u for (u,) in self._db.execute("SELECT DISTINCT user FROM attempts")]

    def changes_since(self, version: int) -> tuple[int, bool, list[str]]:
        """(the version now, whether the table was cleared since `version`, the learners whose
        attempts changed since): what a reader that saw `version` must read again."""
        with self._lock:
            return (self.version, self._cleared_at > version,
                    [u for u, v in self._changed.items() if v > version])

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM attempts").fetchone()[0]

    def clear(self) -> int:
        """Delete every attempt (the instructor's action after a class); return how many."""
        with self._lock:
            self._still_on_disk()
            deleted = self._db.execute("DELETE FROM attempts").rowcount
            self.version += 1
            self._cleared_at = self.version
            self._changed.clear()
        with self._lock:
            self._db.execute("VACUUM")  # the learners' messages leave the file too
        return deleted

    def rows_after(self, rowid: int, limit: int) -> list[tuple]:
        """Up to `limit` rows after `rowid`, in arrival order, each with its rowid first: the
        CSV export reads the table a piece at a time and never holds the lock for long."""
        with self._lock:
            return self._db.execute(
                f"SELECT rowid, {COLUMNS} FROM attempts WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (rowid, limit),
            ).fetchall()

    def csv_pieces(self) -> Iterator[str]:
        """Every attempt as CSV (a header, then one row each, keys joined by spaces), in pieces
        of CSV_CHUNK rows; every learner-sent cell made safe for a spreadsheet."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_FIELDS)
        after, chunk = 0, CSV_CHUNK
        while True:
            rows = self.rows_after(after, chunk)
            for rowid, *row in rows:
                a = as_attempt(row)
                writer.writerow([csv_safe(a.user), a.id, a.time, csv_safe(a.lesson),
                                 csv_safe(a.exercise), "yes" if a.passed else "no",
                                 csv_safe(" ".join(a.keys)), csv_safe(a.message), a.received])
                after = rowid
            yield out.getvalue()
            out.seek(0)
            out.truncate()
            if len(rows) < chunk:
                return

    def to_csv(self) -> str:
        return "".join(self.csv_pieces())

    def close(self) -> None:
        with self._lock:
            self._db.close()


def as_attempt(row: tuple) -> Attempt:
    u, i, t, lesson, ex, p, k, m, rec = row
    return Attempt(u, i, t, lesson, ex, bool(p), tuple(json.loads(k)), m, rec)


def csv_safe(text: str) -> str:
    """A cell a spreadsheet will not run as a formula (OWASP's CSV injection advice)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def open_store(path: str | Path) -> tuple[Store | None, str]:
    """The store at `path`, and what happened to get it ("" when nothing did): an unreadable file
    is renamed aside and a fresh one started; (None, why) when not even that works."""
    path = Path(path)
    try:
        return Store(path), ""
    except (sqlite3.Error, OSError) as error:
        problem = f"{path} could not be opened ({type(error).__name__}: {error})"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept = path.with_name(f"{path.name}.unreadable-{stamp}")
    try:
        moved = False
        for suffix in ("", "-wal", "-shm"):
            old = Path(f"{path}{suffix}")
            if old.is_file():
                old.rename(Path(f"{kept}{suffix}"))
                moved = True
        fresh = Store(path)
    except (sqlite3.Error, OSError) as error:
        why = f"{problem}, and no fresh one could be started ({type(error).__name__}: {error})"
        log.error("%s: running without a store", why)
        return None, why
    if moved:
        problem += f"; it was kept as {kept.name} and a fresh record started"
    log.error("%s", problem)
    return fresh, problem
