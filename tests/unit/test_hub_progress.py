"""The hub's progress service without a hub, module by module (docker/hub/amp_progress): its store,
what it accepts (records, course), its limits, who may do what (access) and the instructor's view
and its order (view). Its handlers are tests/unit/test_hub_progress_service.py; the service wired
into a real hub is tests/e2e/test_hub.py."""

from __future__ import annotations

import csv
import html
import io
import json
import re
import sys
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.docker_env import HUB_DIR

if str(HUB_DIR) not in sys.path:  # the service's package, as the hub image has it
    sys.path.insert(0, str(HUB_DIR))
from amp_progress import access as progress_access  # noqa: E402
from amp_progress import course, limits  # noqa: E402
from amp_progress import records as progress_input  # noqa: E402
from amp_progress import store as progress_store  # noqa: E402
from amp_progress import view as progress_view  # noqa: E402

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


def record(exercise: str = "autocast_settings", passed: bool = False, minutes_ago: float = 10,
           keys: tuple[str, ...] = ("fp16-on-cpu",), message: str = "cpu: float16 on the CPU.",
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
    assert rows[0]["message"] == "'=HYPERLINK(1)" and rows[0]["keys"] == "fp16-on-cpu"
    assert set(rows[0]) == set(progress_store.CSV_FIELDS)
    store.add("=cmd|' /C calc'!A0", parse(post(record())), "t")  # an admitted user's odd name
    [odd] = [r for r in csv.DictReader(io.StringIO(store.to_csv())) if "calc" in r["user"]]
    assert odd["user"].startswith("'=")


def test_the_csv_comes_in_pieces_with_every_row_once(store: progress_store.Store,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_store, "CSV_CHUNK", 7)
    for user in ("ada", "bob", "cyd"):
        store.add(user, parse(post(*(record() for _ in range(10)))), "t")
    pieces = list(store.csv_pieces())
    assert len(pieces) == 5  # 30 rows, 7 at a time: 4 full pieces and a short last one
    rows = list(csv.DictReader(io.StringIO("".join(pieces))))
    assert len({(r["user"], r["id"]) for r in rows}) == len(rows) == 30


def test_a_learner_over_the_row_cap_stores_nothing_of_that_post(
        store: progress_store.Store) -> None:
    store.add("ada", parse(post(*(record() for _ in range(8)))), "t", max_rows=10)
    again = parse(post(*(record() for _ in range(3))))
    with pytest.raises(progress_store.Full):
        store.add("ada", again, "t", max_rows=10)
    assert store.count_of("ada") == 8  # all or nothing
    assert store.add("ada", again[:2], "t", max_rows=10) == 2
    assert store.add("ada", again[:2], "t", max_rows=10) == 0  # a resend at the cap: no error
    assert store.add("bob", again, "t", max_rows=10) == 3  # the cap is per learner


def test_an_unreadable_store_is_set_aside_and_a_fresh_one_started(tmp_path: Path) -> None:
    path = tmp_path / "progress.sqlite"
    path.write_bytes(b"not a database, " * 512)
    opened, problem = progress_store.open_store(path)
    assert opened is not None and opened.count() == 0
    [kept] = tmp_path.glob("progress.sqlite.unreadable-*")
    assert kept.read_bytes().startswith(b"not a database") and kept.name in problem
    assert opened.add("ada", parse(post(record())), "t") == 1
    opened.close()


def test_a_store_that_cannot_be_made_leaves_the_service_degraded(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a regular file where the store's folder should be")
    opened, problem = progress_store.open_store(blocker / "progress.sqlite")
    assert opened is None and "could not be opened" in problem


def test_a_store_deleted_while_running_is_written_back_before_the_next_write(
        store: progress_store.Store) -> None:
    store.add("ada", parse(post(record(), record())), "t")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    store.add("bob", parse(post(record())), "t")
    path = store.path
    store.close()
    again = progress_store.Store(path)  # as after a restart
    assert sorted(a.user for a in again.attempts()) == ["ada", "ada", "bob"]
    again.close()


# --- how much one learner may send ------------------------------------------------------

def test_the_rate_limit_lets_a_burst_through_then_refills() -> None:
    now = [0.0]
    limiter = limits.Limiter(posts=limits.Rate(3, 1.0), records=limits.Rate(10, 2.0),
                             clock=lambda: now[0])
    assert [limiter.post("ada") for _ in range(3)] == [0, 0, 0]
    assert limiter.post("ada") == pytest.approx(1.0)  # a second until the next post
    assert limiter.post("bob") == 0  # per learner
    now[0] += 1.0
    assert limiter.post("ada") == 0
    assert limiter.records_of("ada", 10) == 0
    assert limiter.records_of("ada", 4) == pytest.approx(2.0)
    now[0] += 2.0
    assert limiter.records_of("ada", 4) == 0


def test_an_honest_learner_stays_under_the_limits_a_flooder_hits_them_at_once() -> None:
    """Honest: a 100-record backlog after an outage, then a check every 2 s for half an hour.
    A flood: 200-record posts back to back."""
    now = [0.0]
    limiter = limits.Limiter(clock=lambda: now[0])
    assert limiter.post("ada") == 0 and limiter.records_of("ada", 100) == 0
    for _ in range(900):
        now[0] += 2.0
        assert limiter.post("ada") == 0 and limiter.records_of("ada", 1) == 0
    accepted = sum(limiter.post("eve") == 0 and limiter.records_of("eve", 200) == 0
                   for _ in range(100))
    assert accepted == limits.RECORDS.burst // 200
    assert 100 + 900 < limits.MAX_ROWS


# --- what a post may hold ------------------------------------------------------------

LONG_NAME = "x" * 255_000  # a learner-sent value far longer than any reply may quote


@pytest.mark.parametrize("body, status, why", [
    (b"{not json", 400, "not JSON"),
    (b"\xff\xfe", 400, "not JSON"),
    (b"[1, 2]", 400, "attempts"),
    (b'{"attempts": {}}', 400, "attempts"),
    (post(record(), extra=1), 400, "unexpected"),
    (post({"id": "x"}), 400, "lacks"),
    (post(record(id="../../etc")), 400, "id"),
    (post(record(lesson="1")), 400, "course's exercises"),
    (post(record(exercise="<script>")), 400, "course's exercises"),
    (post(record(exercise="made_up_exercise_0001")), 400, "course's exercises"),
    (post(record(lesson="02")), 400, "course's exercises"),  # a real name, in another lesson
    (post(record(passed="yes")), 400, "passed"),
    (post(record(keys=("a b",))), 400, "course's mistakes"),
    (post(record(keys=("made-up-mistake",))), 400, "course's mistakes"),
    (post(record(keys=["fp16-on-cpu"] * 21)), 400, "keys"),
    (post(record(message="x" * 401)), 400, "message"),
    (post(record(extra_field="x")), 400, "fields"),
    (post(record(time="yesterday")), 400, "time"),
    (post(record(time="2026-11-26T11:00:00")), 400, "zone"),
    (post(*(record() for _ in range(201))), 413, "at most 200"),
    (b" " * (progress_input.MAX_BODY_BYTES + 1), 413, "bytes"),
    (post(record(), user="bob"), 403, "cannot post for 'bob'"),
    (post(record(), record(user="bob")), 403, "names 'bob'"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "not JSON"),  # deep nesting: a RecursionError
])
def test_a_bad_post_is_refused_whole_with_a_4xx(body: bytes, status: int, why: str) -> None:
    with pytest.raises(progress_input.BadPost, match=why) as refused:
        parse(body)
    assert refused.value.status == status


@pytest.mark.parametrize("body", [
    post(record(), user=LONG_NAME), post(record(user=LONG_NAME)),
    post(record(exercise=LONG_NAME[:60])), post(record(keys=(LONG_NAME,))),
])
def test_a_refusal_quotes_at_most_a_few_characters_of_what_was_sent(body: bytes) -> None:
    with pytest.raises(progress_input.BadPost) as refused:
        parse(body)
    assert len(str(refused.value)) < 200 and "x" * 40 not in str(refused.value)


@pytest.mark.parametrize("sent, stored", [
    ((NOW + timedelta(hours=23, minutes=59)).isoformat(), "2026-11-26T12:00:00+00:00"),
    ("9999-12-31T23:59:59-01:00", "2026-11-26T12:00:00+00:00"),
    ("0001-01-01T00:00:00+01:00", "2026-11-19T12:00:00+00:00"),  # a 500 before: now a week ago
    ("2026-11-26T13:30:00+02:00", "2026-11-26T11:30:00+00:00"),  # honest, in another zone
])
def test_times_are_clamped_to_the_servers_clock(sent: str, stored: str) -> None:
    [checked] = parse(post(record(time=sent)))
    assert checked["time"] == stored


def test_a_lone_surrogate_in_the_message_is_stored_not_a_500(
        store: progress_store.Store) -> None:
    body = post(record(message="bad \ud800 byte"))
    assert b"\\ud800" in body  # valid JSON, but not text SQLite can hold
    records = parse(body)
    assert records[0]["message"] == "bad \ufffd byte"
    assert store.add("ada", records, "t") == 1 and store.attempts()[0].message == "bad \ufffd byte"


def test_the_course_manifest_is_what_the_course_defines_now() -> None:
    """course.json is generated from the checkers (course_tools.exercise_manifest): a checker's
    new key or exercise without a regenerated file fails here."""
    from amp_tutorial.quiz import QUIZZES
    from course_tools import exercise_manifest

    assert course.MANIFEST.read_text(encoding="utf-8") == exercise_manifest.text(), (
        "run: python -m course_tools.exercise_manifest")
    assert ("01", "autocast_settings") in course.COURSE.exercises
    assert {("06", "quiz"), ("17", "quiz")} <= course.COURSE.exercises  # the core and advanced
    assert {"device-type-hard-coded-cuda", "raised", "timed-out", "question-1-wrong"} <= (
        course.COURSE.keys)
    assert "answers-not-a-dict" in course.COURSE.keys  # a quiz's record of `answers = [...]`
    longest = max(len(quiz.questions) for quiz in QUIZZES)
    assert {f"question-{longest}-wrong", f"question-{longest}-unanswered"} <= course.COURSE.keys
    assert f"question-{longest + 1}-wrong" not in course.COURSE.keys  # no question that is not
    assert "cpu" not in course.COURSE.keys  # DEVICE_TYPE = "cpu" is a setting, not a mistake


def says(words: str, message: str) -> bool:
    """Whether the course's `words` for a key are what a checker's `message` says: their literal
    parts in order, ``…`` standing for what the run filled in, the why between what and fix."""
    what, _, fix = words.partition(" Instead: ")
    pattern = ".*?".join(map(re.escape, what.split("…")))
    if fix:
        pattern += ".* Instead: " + ".*?".join(map(re.escape, fix.split("…")))
    return re.search(pattern, " ".join(message.split())) is not None


def test_every_key_a_checker_names_is_one_the_service_takes_in_words_it_says() -> None:
    """Lesson 01's checker on a wrong answer: each key it records passes the service's check, and
    the course's words for it (course.json) are what the checker said for it."""
    from amp_tutorial.exercises.autocast_settings import check_autocast_settings

    def hard_coded(device):
        import torch
        return "cuda", torch.float16, True

    result = check_autocast_settings(hard_coded)
    assert result.keys and result.keys <= course.COURSE.keys, result.keys
    for problem in result.problems:
        words = course.COURSE.words_for(("01", "autocast_settings"), problem.key)
        assert any(says(w, problem.message) for w in words), (problem, words)


def test_every_key_of_the_course_has_the_courses_words() -> None:
    """Each key has words at an exercise or in the checkers' shared code; a quiz's question keys
    quote their question, and only at their own quiz."""
    from amp_tutorial.quiz import QUIZZES

    known = set(course.COURSE.shared_words).union(*course.COURSE.words.values())
    assert course.COURSE.keys <= known, sorted(course.COURSE.keys - known)
    for quiz in QUIZZES:
        for number, question in quiz.questions.items():
            [wrong] = course.COURSE.words_for((quiz.lesson, "quiz"), f"question-{number}-wrong")
            assert question.text in wrong and "answered wrong" in wrong
    core, advanced = QUIZZES
    assert course.COURSE.words_for((core.lesson, "quiz"), "question-1-wrong") != (
        course.COURSE.words_for((advanced.lesson, "quiz"), "question-1-wrong"))
    assert course.COURSE.words_for(("01", "autocast_settings"), "question-1-wrong") == ()
    # the helper's words, as 01 calls it: an error, or one of GradScaler's internal checks
    raised, scaler_check = course.COURSE.words_for(("01", "autocast_settings"), "raised")
    assert raised.startswith("autocast_settings raised")
    assert scaler_check.startswith("autocast_settings stopped inside GradScaler")


CHECKER = '''
from amp_tutorial.exercises.checking import RAISED, Problem

LATE = "late-step"
EARLY = "early-step"
LOOPED = "looped"
RULES = [("late", LATE, "Stepped {n} times late.", "Why it matters.", "step on time.")]


def _problems(n, name):
    found = [Problem.named(EARLY, f"Stepped {n} early in {name}.", "Why.", f"step {n} later.")]
    found += [Problem.named(key, what.format(n=n), why, fix) for _, key, what, why, fix in RULES]

    def bad(message):
        return Problem(LOOPED, message)

    found += [bad("The loop never ended."), bad(f"It ran {n} times.")]
    return found + [Problem(RAISED, f"{name} raised {n}.")]
'''


def test_the_words_are_read_from_each_way_a_checker_names_a_problem(tmp_path: Path) -> None:
    """Problem.named with the run's values (…), a rule table's str.format templates, a helper
    that makes a problem from the words it is passed, a key imported from checking.py."""
    import importlib.util

    from amp_tutorial.exercises import checking
    from course_tools import exercise_manifest

    path = tmp_path / "made_up_checker.py"
    path.write_text(CHECKER)
    spec = importlib.util.spec_from_file_location("made_up_checker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = exercise_manifest.Source.of(module, {checking.__name__: checking})
    keys = {"late-step", "early-step", "looped", "raised"}
    helpers = exercise_manifest._helpers({module.__name__: source}, keys)
    assert exercise_manifest.source_words(source, helpers, keys) == {
        "early-step": ["Stepped … early in …. Instead: step … later."],
        "late-step": ["Stepped … times late. Instead: step on time."],
        "looped": ["The loop never ended.", "It ran … times."],  # bad(message), each call
        "raised": ["… raised …."],
    }


def test_a_good_post_is_normalised() -> None:
    keys = ("wrong-order", "raised", "wrong-order")
    [checked] = parse(post(record(keys=keys, message="two\n  lines", user="ada")))
    assert checked["keys"] == ["raised", "wrong-order"] and checked["message"] == "two lines"
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
        ("ada", record(keys=("no-scaler-with-fp16",), message="ada's words")),
        ("ada", record(keys=("no-scaler-with-fp16",), message="ada's words")),
        ("ada", record(keys=("no-scaler-with-fp16",), message="ada's words")),
        ("bob", record(keys=("fp16-on-cpu",), message="bob's words", minutes_ago=3)),
        ("cyd", record(keys=("fp16-on-cpu", "no-scaler-with-fp16"), message="cyd's words",
                       minutes_ago=2)),
    )
    mistake = progress_view.class_view(attempts, NOW).mistakes[("01", "autocast_settings")]
    assert (mistake.key, mistake.learners, mistake.attempts) == ("no-scaler-with-fp16", 2, 4)
    assert mistake.words == course.COURSE.words_for(("01", "autocast_settings"),
                                                    "no-scaler-with-fp16")  # the course's
    assert mistake.words and not any("words" in w for w in mistake.words)


PRANK = "known checker bug, set the default dtype to float16 and re-run"


def row_of(page: str, user: str) -> str:
    row = page[page.index(f'data-user="{user}"'):]
    return row[:row.index("</tr>")]


def test_the_class_summary_quotes_the_course_and_a_learners_words_only_their_row() -> None:
    """A learner's server posts a made-up sentence with a real key: the class's summary tells
    that key in the course's words, and the sentence shows only in that learner's row, marked
    as what their server sent."""
    key = "device-type-hard-coded-cuda"
    attempts = stored(("bob", record(keys=(key,), message="[cpu] device_type was 'cuda'.",
                                     minutes_ago=20)),
                      ("eve", record(keys=(key,), message=PRANK, minutes_ago=1)))
    view = progress_view.class_view(attempts, NOW)
    mistake = view.mistakes[("01", "autocast_settings")]
    assert mistake.key == key and mistake.learners == 2
    assert mistake.words == course.COURSE.words_for(("01", "autocast_settings"), key)
    assert mistake.words and "hard-coded" in mistake.words[0]
    page = progress_view.render_page(view, NOW, "teacher", "/services/amp-progress/", "<input>")
    summary = page[page.index('<ul id="mistakes">'):]
    assert f"The checker says: {html.escape(mistake.words[0])}</span>" in summary
    assert PRANK not in summary and "device_type was &#x27;cuda&#x27;" not in summary
    assert page.count(PRANK) == 1
    assert f'their server sent:</span> <q>{PRANK}</q>' in row_of(page, "eve")
    assert "their server sent:</span> <q>[cpu] device_type was &#x27;cuda&#x27;.</q>" in (
        row_of(page, "bob"))


def test_a_key_the_course_has_no_words_for_is_shown_alone(tmp_path: Path) -> None:
    """A course.json from before the words (or a key without any): the summary names the key and
    quotes nothing, not even the learner's message."""
    older = tmp_path / "course.json"
    older.write_text(json.dumps({"exercises": [["01", "autocast_settings"]], "keys": ["raised"]}))
    loaded = course.load(older)
    assert loaded.words_for(("01", "autocast_settings"), "raised") == ()
    view = progress_view.class_view(stored(("eve", record(keys=("raised",), message=PRANK))),
                                    NOW, loaded)
    table = progress_view.table_html(view, NOW)
    summary = table[table.index('<ul id="mistakes">'):]
    assert "<code>raised</code>, 1 learner, 1 attempt.</li>" in summary and PRANK not in summary


def test_the_page_shows_each_cell_and_escapes_what_learners_sent() -> None:
    attempts = stored(("ada", record(passed=True)),
                      ("bob", record(keys=("fp16-on-cpu",), message="<b>float16</b> on CPU")))
    page = progress_view.render_page(progress_view.class_view(attempts, NOW), NOW,
                                     "teacher", "/services/amp-progress/", "<input>")
    assert "&lt;b&gt;float16&lt;/b&gt; on CPU" in page and "<b>float16</b>" not in page
    assert 'data-user="bob"' in page and "passed<br><small>1 attempt</small>" in page
    assert "last activity 10 min ago" in page and "2 learners, 1 stuck, 2 attempts" in page
    assert page.index('data-user="bob"') < page.index('data-user="ada"')  # stuck first
    assert 'href="/services/amp-progress/attempts.csv"' in page
    assert progress_view.table_html(progress_view.class_view([], NOW), NOW).endswith(
        "No attempts recorded yet.</p>")
