"""The hub's progress service without a hub: its store (docker/hub/progress_store.py), what it
accepts (progress_input.py), who may do what (progress_access.py) and the instructor's view and
its order (progress_view.py). The service wired into a real hub is tests/e2e/test_hub.py."""

from __future__ import annotations

import csv
import io
import json
import sys
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.docker_env import HUB_DIR

sys.path.insert(0, str(HUB_DIR))  # the service's modules import each other, as in the hub image
import progress_access  # noqa: E402
import progress_input  # noqa: E402
import progress_store  # noqa: E402
import progress_view  # noqa: E402

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


def record(exercise: str = "autocast_settings", passed: bool = False, minutes_ago: float = 10,
           keys: tuple[str, ...] = ("cpu-float16",), message: str = "cpu: float16 on the CPU.",
           lesson: str = "01", **extra: object) -> dict:
    when = (NOW - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")
    return {"id": uuid.uuid4().hex, "time": when, "lesson": lesson, "exercise": exercise,
            "passed": passed, "keys": [] if passed else list(keys),
            "message": "All checks passed." if passed else message, **extra}


def post(*records: dict, **top: object) -> bytes:
    return json.dumps({"attempts": list(records), **top}).encode()


def parse(body: bytes, user: str = "ada") -> list[dict]:
    return progress_input.parse_post(body, user, now=NOW)


@pytest.fixture
def store(tmp_path: Path) -> progress_store.Store:
    opened = progress_store.Store(tmp_path / "progress.sqlite")
    yield opened
    opened.close()


# --- the store ------------------------------------------------------------

def test_a_record_sent_twice_is_stored_once(store: progress_store.Store) -> None:
    records = parse(post(record(), record(passed=True, minutes_ago=5)))
    assert store.add("ada", records, "t1") == 2
    assert store.add("ada", records, "t2") == 0  # a retry: nothing new
    assert store.add("ada", records[:1] + parse(post(record())), "t3") == 1
    assert store.count() == 3
    assert [a.received for a in store.attempts()] == ["t1", "t3", "t1"]  # by the learner's time


def test_the_same_id_from_two_learners_is_two_attempts(store: progress_store.Store) -> None:
    """The key is (user, id): a learner cannot block or overwrite another's record by its id."""
    [one] = parse(post(record()))
    assert store.add("ada", [one], "t") == 1 and store.add("bob", [one], "t") == 1
    assert sorted(a.user for a in store.attempts()) == ["ada", "bob"]


def test_concurrent_posts_store_every_record_exactly_once(store: progress_store.Store) -> None:
    batches = [parse(post(*(record() for _ in range(20)))) for _ in range(8)]
    threads = [threading.Thread(target=store.add, args=(f"u{i % 4}", batch, "t"))
               for i, batch in enumerate(batches + batches)]  # every batch posted twice at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.count() == 8 * 20


def test_attempts_survive_reopening_and_clear_removes_them(tmp_path: Path) -> None:
    path = tmp_path / "progress.sqlite"
    first = progress_store.Store(path)
    first.add("ada", parse(post(record(), record())), "t")
    first.close()
    again = progress_store.Store(path)  # as after a hub restart
    assert again.count() == 2
    assert again.clear() == 2 and again.count() == 0
    again.close()
    assert b"float16 on the CPU" not in path.read_bytes()  # the words left the file too


def test_the_csv_export_has_every_attempt_and_runs_no_formula(
        store: progress_store.Store) -> None:
    formula, passed = record(message="=HYPERLINK(1)"), record(passed=True, minutes_ago=1)
    store.add("ada", parse(post(formula, passed)), "t")
    rows = list(csv.DictReader(io.StringIO(store.to_csv())))
    assert [r["passed"] for r in rows] == ["no", "yes"]
    assert rows[0]["message"] == "'=HYPERLINK(1)" and rows[0]["keys"] == "cpu-float16"
    assert set(rows[0]) == set(progress_store.CSV_FIELDS)


# --- what a post may hold ------------------------------------------------------------

@pytest.mark.parametrize("body, status, why", [
    (b"{not json", 400, "not JSON"),
    (b"\xff\xfe", 400, "not JSON"),
    (b"[1, 2]", 400, "attempts"),
    (b'{"attempts": {}}', 400, "attempts"),
    (post(record(), extra=1), 400, "unexpected"),
    (post({"id": "x"}), 400, "lacks"),
    (post(record(id="../../etc")), 400, "id"),
    (post(record(lesson="1")), 400, "lesson"),
    (post(record(exercise="<script>")), 400, "exercise"),
    (post(record(passed="yes")), 400, "passed"),
    (post(record(keys=("a b",))), 400, "keys"),
    (post(record(keys=tuple(f"k{i}" for i in range(21)))), 400, "keys"),
    (post(record(message="x" * 401)), 400, "message"),
    (post(record(time="yesterday")), 400, "time"),
    (post(record(time="2026-11-26T11:00:00")), 400, "zone"),
    (post(record(minutes_ago=-3 * 24 * 60)), 400, "future"),
    (post(*(record() for _ in range(501))), 413, "at most 500"),
    (b" " * (progress_input.MAX_BODY_BYTES + 1), 413, "bytes"),
    (post(record(), user="bob"), 403, "cannot post for 'bob'"),
    (post(record(), record(user="bob")), 403, "names 'bob'"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "not JSON"),  # deep nesting: a RecursionError
])
def test_a_bad_post_is_refused_whole_with_a_4xx(body: bytes, status: int, why: str) -> None:
    with pytest.raises(progress_input.BadPost, match=why) as refused:
        parse(body)
    assert refused.value.status == status


def test_a_good_post_is_normalised() -> None:
    [checked] = parse(post(record(keys=("b", "a", "b"), message="two\n  lines", user="ada")))
    assert checked["keys"] == ["a", "b"] and checked["message"] == "two lines"
    assert checked["time"] == "2026-11-26T11:50:00+00:00" and "user" not in checked


# --- who may do what ------------------------------------------------------------

def model(name: str, *scopes: str, kind: str = "user") -> dict:
    return {"name": name, "kind": kind, "scopes": list(scopes)}


def test_a_post_is_from_the_tokens_learner_with_the_post_scope() -> None:
    post_scope = progress_access.POST_SCOPE
    assert progress_access.learner_of(model("ada", post_scope, "access:servers!server")) == "ada"
    assert progress_access.learner_of(model("ada", "self")) is None  # a token without it
    assert progress_access.learner_of(model("cull", post_scope, kind="service")) is None
    assert progress_access.learner_of(None) is None


def test_only_the_read_scope_opens_the_page() -> None:
    read = progress_access.READ_SCOPE
    assert progress_access.may_read(model("teacher", read))
    assert not progress_access.may_read(model("ada", progress_access.POST_SCOPE, "self"))
    assert not progress_access.may_read(model("svc", read, kind="service"))
    assert not progress_access.may_read(None)
    [role] = [r for r in progress_access.roles(["teacher"]) if read in r["scopes"]]
    assert role["users"] == ["teacher"]


# --- the instructor's view ------------------------------------------------------------

def stored(*by_user: tuple[str, dict]) -> list[progress_store.Attempt]:
    return [progress_store.Attempt(user, r["id"], r["time"], r["lesson"], r["exercise"],
                                   r["passed"], tuple(r["keys"]), r["message"], "t")
            for user, r in by_user]


def test_stuck_learners_come_first_most_failures_then_longest_since_a_pass() -> None:
    attempts = stored(
        ("ada", record(passed=True, minutes_ago=30)),  # passed and moved on: not stuck
        ("ada", record("fp16_step", passed=True, minutes_ago=20)),
        ("bob", record(minutes_ago=40)), ("bob", record(minutes_ago=30)),  # 2 failures
        ("cyd", record(passed=True, minutes_ago=50)),  # 3 failures on the next one
        *(("cyd", record("fp16_step", minutes_ago=m)) for m in (45, 40, 35)),
        ("dan", record(minutes_ago=90)), ("dan", record(minutes_ago=1)),  # 2, longer since
        ("eve", record(minutes_ago=5)),
        ("eve", record(passed=True, minutes_ago=4)),  # failed, then passed: not stuck
    )
    view = progress_view.class_view(attempts, NOW)
    assert [learner.name for learner in view.learners] == ["cyd", "dan", "bob", "ada", "eve"]
    assert [learner.failed_on_current for learner in view.learners] == [3, 2, 2, 0, 0]
    assert view.exercises == [("01", "autocast_settings"), ("01", "fp16_step")]
    cyd = view.learners[0]
    assert cyd.current == ("01", "fp16_step") and cyd.cells[("01", "autocast_settings")].passed
    assert view.attempts == len(attempts)


def test_the_most_common_mistake_counts_learners_first() -> None:
    attempts = stored(
        ("ada", record(keys=("no-scaler",), message="ada's words")),
        ("ada", record(keys=("no-scaler",), message="ada's words")),
        ("ada", record(keys=("no-scaler",), message="ada's words")),
        ("bob", record(keys=("cpu-float16",), message="bob's words", minutes_ago=3)),
        ("cyd", record(keys=("cpu-float16", "no-scaler"), message="cyd's words", minutes_ago=2)),
    )
    mistake = progress_view.class_view(attempts, NOW).mistakes[("01", "autocast_settings")]
    assert (mistake.key, mistake.learners, mistake.attempts) == ("no-scaler", 2, 4)
    assert mistake.words == "cyd's words"  # the latest words said for it


def test_the_page_shows_each_cell_and_escapes_what_learners_sent() -> None:
    attempts = stored(("ada", record(passed=True)),
                      ("bob", record(keys=("cpu-float16",), message="<b>float16</b> on CPU")))
    page = progress_view.render_page(progress_view.class_view(attempts, NOW), NOW,
                                     "teacher", "/services/amp-progress/", "<input>")
    assert "&lt;b&gt;float16&lt;/b&gt; on CPU" in page and "<b>float16</b>" not in page
    assert 'data-user="bob"' in page and "passed<br><small>1 attempt</small>" in page
    assert "last activity 10 min ago" in page and "2 learners, 1 stuck, 2 attempts" in page
    assert page.index('data-user="bob"') < page.index('data-user="ada"')  # stuck first
    assert 'href="/services/amp-progress/attempts.csv"' in page
    assert progress_view.table_html(progress_view.class_view([], NOW), NOW).endswith(
        "No attempts recorded yet.</p>")
