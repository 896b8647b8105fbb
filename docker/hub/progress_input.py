"""What a learner's server may post to the progress service, checked before anything is stored.

A post is JSON, `{"attempts": [record, ...]}`, each record as amp_tutorial.progress writes it
({"id", "time", "lesson", "exercise", "passed", "keys", "message"}). The whole post is refused
(nothing stored) when any part is wrong: the error says which record and why, with a 4xx status.
A post that names a user (at the top or in a record) is refused with 403 unless it names the
token's own user: the service takes the user from the token alone.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

MAX_BODY_BYTES = 256 * 1024  # 200 full-length records fit in about 100 KiB
MAX_RECORDS = 500
MAX_KEYS = 20
MAX_MESSAGE = 400  # the client sends the first ~200 characters of the checker's words
FIELDS = {"id", "time", "lesson", "exercise", "passed", "keys", "message"}
ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex
LESSON = re.compile(r"[0-9]{2}")
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # exercise names and problem keys
FUTURE_SLACK = timedelta(days=1)  # a learner's clock may be wrong, not by days


class BadPost(Exception):
    """A post to refuse: `status` is the HTTP status, the message says why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def parse_post(body: bytes, user: str, now: datetime | None = None) -> list[dict[str, Any]]:
    """The records of a post by `user` (the token's user), checked; raises BadPost otherwise."""
    if len(body) > MAX_BODY_BYTES:
        raise BadPost(413, f"the post is {len(body)} bytes; at most {MAX_BODY_BYTES}")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise BadPost(400, f"the post is not JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
        raise BadPost(400, 'expected {"attempts": [...]}')
    named = data.get("user")
    if named is not None and named != user:
        raise BadPost(403, f"this token belongs to {user!r}; it cannot post for {named!r}")
    if set(data) - {"attempts", "user"}:
        raise BadPost(400, f"unexpected fields {sorted(set(data) - {'attempts', 'user'})}")
    records = data["attempts"]
    if len(records) > MAX_RECORDS:
        raise BadPost(413, f"{len(records)} records in one post; at most {MAX_RECORDS}")
    now = now or datetime.now(timezone.utc)
    return [check_record(record, i, user, now) for i, record in enumerate(records)]


def check_record(record: Any, index: int, user: str, now: datetime) -> dict[str, Any]:
    """One record, checked field by field; returned with only the known fields."""
    where = f"record {index}"
    if not isinstance(record, dict):
        raise BadPost(400, f"{where} is not an object")
    named = record.get("user")
    if named is not None and named != user:
        raise BadPost(403, f"{where} names {named!r}; this token belongs to {user!r}")
    missing = FIELDS - set(record)
    if missing:
        raise BadPost(400, f"{where} lacks {sorted(missing)}")
    if not isinstance(record["id"], str) or not ID.fullmatch(record["id"]):
        raise BadPost(400, f"{where}: id must be 32 lowercase hex digits")
    if not isinstance(record["lesson"], str) or not LESSON.fullmatch(record["lesson"]):
        raise BadPost(400, f"{where}: lesson must be two digits, as '01'")
    if not isinstance(record["exercise"], str) or not NAME.fullmatch(record["exercise"]):
        raise BadPost(400, f"{where}: exercise must be a short name")
    if not isinstance(record["passed"], bool):
        raise BadPost(400, f"{where}: passed must be true or false")
    keys = record["keys"]
    if (
        not isinstance(keys, list)
        or len(keys) > MAX_KEYS
        or not all(isinstance(k, str) and NAME.fullmatch(k) for k in keys)
    ):
        raise BadPost(400, f"{where}: keys must be a list of at most {MAX_KEYS} short names")
    message = record["message"]
    if not isinstance(message, str) or len(message) > MAX_MESSAGE:
        raise BadPost(400, f"{where}: message must be text of at most {MAX_MESSAGE} characters")
    return {
        "id": record["id"],
        "time": check_time(record["time"], where, now),
        "lesson": record["lesson"],
        "exercise": record["exercise"],
        "passed": record["passed"],
        "keys": sorted(set(keys)),
        "message": " ".join(message.split()),
    }


def check_time(value: Any, where: str, now: datetime) -> str:
    """An ISO 8601 time with a zone, not days ahead; returned in UTC with seconds."""
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise BadPost(400, f"{where}: time must be ISO 8601 with a zone, as 2026-11-26T00:10:00Z")
    if when > now + FUTURE_SLACK:
        raise BadPost(400, f"{where}: time {value} is in the future")
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")
