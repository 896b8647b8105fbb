"""What a learner's server may post to the progress service, checked before anything is stored.

A post is JSON, `{"attempts": [record, ...]}`, each record as amp_tutorial.progress writes it
({"id", "time", "lesson", "exercise", "passed", "keys", "message"}). The whole post is refused
(nothing stored) when any part is wrong: the error says which record and why, with a 4xx status,
and never repeats more than a few characters of what was sent. Only the course's own exercises and
mistake keys are taken (course.COURSE), every field is bounded, and the time is the learner's clock
clamped to the server's: never ahead of it (a record dated tomorrow would stay "latest" all day)
and never older than MAX_AGE. A post that names a user (at the top or in a record) is refused with
403 unless it names the token's own user: the service takes the user from the token alone.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from amp_progress.course import COURSE, Course

MAX_BODY_BYTES = 256 * 1024  # 200 full-length records fit in about 100 KiB
MAX_RECORDS = 200  # amp_tutorial.class_sync sends at most BATCH = 200 at a time
MAX_KEYS = 20
MAX_MESSAGE = 400  # the client sends the first ~200 characters of the checker's words
FIELDS = {"id", "time", "lesson", "exercise", "passed", "keys", "message"}
ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex
MAX_AGE = timedelta(days=7)  # older times (a wrong clock, a forged record) read as a week ago
SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads pairs them; a lone one is left
SHOWN = 32  # at most this much of a learner's value is repeated in a reply


class BadPost(Exception):
    """A post to refuse: `status` is the HTTP status, the message says why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def shown(value: Any) -> str:
    """A learner-sent value as a reply may quote it: its repr, cut to SHOWN characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def parse_post(body: bytes, user: str, now: datetime | None = None,
               course: Course = COURSE) -> list[dict[str, Any]]:
    """The records of a post by `user` (the token's user), checked; raises BadPost otherwise."""
    if len(body) > MAX_BODY_BYTES:
        raise BadPost(413, f"the post is {len(body)} bytes; at most {MAX_BODY_BYTES}")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise BadPost(400, "the post is not JSON (UTF-8)") from None
    if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
        raise BadPost(400, 'expected {"attempts": [...]}')
    named = data.get("user")
    if named is not None and named != user:
        raise BadPost(403, f"this token belongs to {user!r}; it cannot post for {shown(named)}")
    if set(data) - {"attempts", "user"}:
        raise BadPost(400, "unexpected fields beside attempts and user")
    records = data["attempts"]
    if len(records) > MAX_RECORDS:
        raise BadPost(413, f"{len(records)} records in one post; at most {MAX_RECORDS}")
    now = now or datetime.now(timezone.utc)
    return [check_record(record, i, user, now, course) for i, record in enumerate(records)]


def check_record(record: Any, index: int, user: str, now: datetime,
                 course: Course = COURSE) -> dict[str, Any]:
    """One record, checked field by field; returned with only the known fields."""
    where = f"record {index}"
    if not isinstance(record, dict):
        raise BadPost(400, f"{where} is not an object")
    named = record.get("user")
    if named is not None and named != user:
        raise BadPost(403, f"{where} names {shown(named)}; this token belongs to {user!r}")
    missing = FIELDS - set(record)
    if missing:
        raise BadPost(400, f"{where} lacks {sorted(missing)}")
    if set(record) - FIELDS - {"user"}:
        raise BadPost(400, f"{where} has fields the course's records do not")
    if not isinstance(record["id"], str) or not ID.fullmatch(record["id"]):
        raise BadPost(400, f"{where}: id must be 32 lowercase hex digits")
    lesson, exercise = record["lesson"], record["exercise"]
    if not isinstance(lesson, str) or not isinstance(exercise, str) or (
            (lesson, exercise) not in course.exercises):
        raise BadPost(400, f"{where}: lesson {shown(lesson)}, exercise {shown(exercise)} is "
                      "not one of the course's exercises")
    if not isinstance(record["passed"], bool):
        raise BadPost(400, f"{where}: passed must be true or false")
    keys = record["keys"]
    if not isinstance(keys, list) or len(keys) > MAX_KEYS:
        raise BadPost(400, f"{where}: keys must be a list of at most {MAX_KEYS}")
    unknown = [k for k in keys if not isinstance(k, str) or k not in course.keys]
    if unknown:
        raise BadPost(400, f"{where}: {shown(unknown[0])} is not one of the course's mistakes")
    message = record["message"]
    if not isinstance(message, str) or len(message) > MAX_MESSAGE:
        raise BadPost(400, f"{where}: message must be text of at most {MAX_MESSAGE} characters")
    return {
        "id": record["id"],
        "time": check_time(record["time"], where, now),
        "lesson": lesson,
        "exercise": exercise,
        "passed": record["passed"],
        "keys": sorted(set(keys)),
        "message": storable(" ".join(message.split())),
    }


def storable(text: str) -> str:
    """Text SQLite and the page can hold: a lone surrogate (valid JSON, not UTF-8) becomes U+FFFD
    instead of failing the store."""
    return SURROGATE.sub("\ufffd", text)


def check_time(value: Any, where: str, now: datetime) -> str:
    """An ISO 8601 time with a zone, clamped into [now - MAX_AGE, now]; returned in UTC."""
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) and len(value) < 40 else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise BadPost(400, f"{where}: time must be ISO 8601 with a zone, as 2026-11-26T00:10:00Z")
    when = min(max(when, now - MAX_AGE), now)  # compared as instants: no overflow at year 1
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")
