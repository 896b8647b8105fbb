"""amp_tutorial.class_sync against a stand-in for the hub's progress service (a local HTTP server
that keeps ids once per token, refuses a record without a lesson with 400, a wrong token with 403,
fails with 500 on a record whose message says "poison", answers what a test sets, and can be
down): what is sent, once, what waits for the service, and that nothing it answers stalls the
client. The client against the real service is in tests/unit/test_hub_progress_service.py."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from amp_tutorial import class_sync

TOKEN = "ada-server-token"


class Service:
    def __init__(self, answer=None) -> None:
        self.stored: dict[str, dict] = {}
        self.posts = 0
        self.tokens: list[str | None] = []
        self.answer = answer  # (handler, records) -> True when it answered instead
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                service.posts += 1
                service.tokens.append(self.headers.get("Authorization"))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                records = body["attempts"]
                if service.answer is not None and service.answer(self, records):
                    return None
                if self.headers.get("Authorization") != f"token {TOKEN}":
                    return self.reply(403, {"error": "not your token"})
                if any("lesson" not in r or r["lesson"] is None for r in records):
                    return self.reply(400, {"error": "lesson missing"})
                if any("poison" in r["message"] for r in records):
                    return self.reply(500, {"error": "Internal Server Error"})
                for r in records:
                    service.stored.setdefault(r["id"], r)
                self.reply(200, {"acknowledged": [r["id"] for r in records]})

            def reply(self, status: int, data: object, headers: dict | None = None) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/amp-progress/api/attempts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[Service]:
    running = Service()
    yield running
    running.stop()


def attempt(lesson: str | None = "01", message: str = "float16 on the CPU") -> dict:
    return {"id": uuid.uuid4().hex, "time": "2026-11-26T00:00:00+00:00", "lesson": lesson,
            "exercise": "autocast_settings", "passed": False, "keys": ["fp16-on-cpu"],
            "message": message}


def write(path: Path, *records: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_each_record_is_sent_once_and_acknowledged_beside_the_record(
        tmp_path: Path, service: Service) -> None:
    path = tmp_path / ".amp_tutorial/attempts.jsonl"
    first = [attempt(), attempt()]
    write(path, *first)
    assert class_sync.send_pending(path, service.url, TOKEN) == 2
    assert class_sync.send_pending(path, service.url, TOKEN) == 0  # nothing left
    assert service.posts == 1
    write(path, attempt())
    assert class_sync.send_pending(path, service.url, TOKEN) == 1
    assert set(class_sync.sent_path(path).read_text().split()) == set(service.stored)
    assert class_sync.sent_path(path).name == "attempts.sent" and len(service.stored) == 3


def test_attempts_made_while_the_service_is_down_arrive_later_exactly_once(
        tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    down = Service()
    url = down.url
    down.stop()  # nothing listens there now
    write(path, attempt(), attempt())
    assert class_sync.send_pending(path, url, TOKEN) == 0
    assert len(class_sync.pending(path)) == 2
    back = Service()
    try:
        write(path, attempt())
        assert class_sync.send_pending(path, back.url, TOKEN) == 3
        assert class_sync.send_pending(path, back.url, TOKEN) == 0
        assert len(back.stored) == 3 and class_sync.pending(path) == []
    finally:
        back.stop()


def test_a_refused_token_leaves_everything_pending(tmp_path: Path, service: Service) -> None:
    path = tmp_path / "attempts.jsonl"
    write(path, attempt())
    assert class_sync.send_pending(path, service.url, "someone-elses") == 0
    assert len(class_sync.pending(path)) == 1 and not service.stored


def test_a_malformed_record_does_not_hold_back_the_others(tmp_path: Path,
                                                          service: Service) -> None:
    path = tmp_path / "attempts.jsonl"
    good, bad = attempt(), attempt(lesson=None)
    write(path, good, bad)
    with path.open("a") as f:
        f.write('{"id": "cut short by a full dis')  # a torn last line is skipped
    assert class_sync.send_pending(path, service.url, TOKEN) == 1  # good sent, bad set aside
    assert list(service.stored) == [good["id"]] and class_sync.pending(path) == []
    [aside] = class_sync.refused_path(path).read_text().splitlines()
    assert aside == f"{bad['id']} 400 lesson missing"
    assert bad["id"] in path.read_text()  # still in the learner's own record


def test_a_record_that_breaks_the_service_is_set_aside_and_later_ones_arrive(
        tmp_path: Path, service: Service) -> None:
    """A 500 on one record alone, while the records beside it are taken, sets it aside."""
    path = tmp_path / "attempts.jsonl"
    poison = attempt(message="poison")
    write(path, poison, attempt())
    assert class_sync.send_pending(path, service.url, TOKEN) == 1
    assert class_sync.refused_path(path).read_text().startswith(f"{poison['id']} 500 ")
    write(path, attempt())
    assert class_sync.send_pending(path, service.url, TOKEN) == 1  # the later attempt arrives
    assert len(service.stored) == 2 and class_sync.pending(path) == []


def test_a_service_that_fails_on_everything_sets_nothing_aside(tmp_path: Path) -> None:
    broken = Service(lambda handler, records: handler.reply(500, {}) or True)
    try:
        path = tmp_path / "attempts.jsonl"
        write(path, attempt(), attempt())
        assert class_sync.send_pending(path, broken.url, TOKEN) == 0
        assert len(class_sync.pending(path)) == 2
        assert not class_sync.refused_path(path).exists()
    finally:
        broken.stop()


@pytest.mark.parametrize("status", [429, 503, 401, 404, 302])
def test_a_busy_or_refusing_service_leaves_everything_for_later(tmp_path: Path,
                                                               status: int) -> None:
    busy = Service(lambda handler, records: handler.reply(
        status, {"error": "later"}, {"Retry-After": "5", "Location": "/elsewhere"}) or True)
    try:
        path = tmp_path / "attempts.jsonl"
        write(path, *(attempt() for _ in range(class_sync.BATCH + 1)))
        assert class_sync.send_pending(path, busy.url, TOKEN) == 0
        assert busy.posts == 1  # it stops at the first such answer
        assert len(class_sync.pending(path)) == class_sync.BATCH + 1
    finally:
        busy.stop()


@pytest.mark.parametrize("reply", [[1, 2], "ok", {"acknowledged": "abc"}, {"stored": 1},
                                   {"acknowledged": ["not-one-of-ours", 7]}])
def test_an_odd_answer_acknowledges_nothing_and_raises_nothing(tmp_path: Path,
                                                              reply: object) -> None:
    odd = Service(lambda handler, records: handler.reply(200, reply) or True)
    try:
        path = tmp_path / "attempts.jsonl"
        write(path, attempt())
        assert class_sync.send_pending(path, odd.url, TOKEN) == 0
        assert len(class_sync.pending(path)) == 1
    finally:
        odd.stop()


def test_a_trickling_answer_is_cut_at_the_deadline(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that sends its answer a byte at a time: the client gives up after TIMEOUT_S
    in all, not per byte."""
    monkeypatch.setattr(class_sync, "TIMEOUT_S", 1.0)

    def trickle(handler, records) -> bool:
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        for _ in range(40):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.1)
        return True

    slow = Service(trickle)
    try:
        path = tmp_path / "attempts.jsonl"
        write(path, attempt())
        began = time.monotonic()
        assert class_sync.send_pending(path, slow.url, TOKEN) == 0
        assert time.monotonic() - began < 2.0
        assert len(class_sync.pending(path)) == 1
    finally:
        slow.stop()


def test_a_redirect_is_not_followed_so_the_token_stays_home(tmp_path: Path,
                                                            service: Service) -> None:
    elsewhere = service.url.replace("127.0.0.1", "localhost")  # another host, same stand-in
    mover = Service(lambda handler, records: handler.reply(
        307, {}, {"Location": elsewhere}) or True)
    try:
        path = tmp_path / "attempts.jsonl"
        write(path, attempt())
        assert class_sync.send_pending(path, mover.url, TOKEN) == 0
        assert service.posts == 0 and service.tokens == []  # the token never went there
    finally:
        mover.stop()


def test_unreadable_lines_in_the_local_files_are_skipped(tmp_path: Path,
                                                         service: Service) -> None:
    path = tmp_path / "attempts.jsonl"
    good, acked = attempt(), attempt()
    write(path, good)
    with path.open("ab") as f:
        f.write(b'{"id": "\xff\xfe broken", "lesson": "01"}\n')
    write(path, acked)
    class_sync.sent_path(path).write_bytes(b"\xff\xfe\n" + acked["id"].encode() + b"\n")
    assert [r["id"] for r in class_sync.pending(path)] == [good["id"]]
    assert class_sync.send_pending(path, service.url, TOKEN) == 1
    assert list(service.stored) == [good["id"]]


def test_off_the_hub_nothing_is_sent_and_nothing_raises(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.delenv("AMP_PROGRESS_URL", raising=False)
    assert not class_sync.configured()
    assert class_sync.sync_in_background(tmp_path / "attempts.jsonl") is None
    assert class_sync.send_pending(tmp_path / "missing.jsonl") == 0


def test_the_background_send_uses_the_hubs_settings(tmp_path: Path, service: Service,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    monkeypatch.setenv("AMP_PROGRESS_URL", service.url)
    path = tmp_path / "attempts.jsonl"
    write(path, attempt())
    thread = class_sync.sync_in_background(path)
    assert thread is not None
    thread.join(10)
    assert len(service.stored) == 1


def test_one_sync_thread_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks made while a send hangs do not pile up threads: the running one goes round once
    more, and sends what they recorded."""
    release = threading.Event()

    def hang_first(handler, records) -> bool:
        if handler_calls.append(1) or len(handler_calls) == 1:
            release.wait(5)
        return False

    handler_calls: list[int] = []
    slow = Service(hang_first)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    monkeypatch.setenv("AMP_PROGRESS_URL", slow.url)
    try:
        path = tmp_path / "attempts.jsonl"
        write(path, attempt())
        first = class_sync.sync_in_background(path)
        time.sleep(0.3)
        write(path, attempt())
        later = [class_sync.sync_in_background(path) for _ in range(5)]
        assert all(thread is first for thread in later)
        assert sum(t.name == "amp-progress-sync" for t in threading.enumerate()) == 1
        release.set()
        first.join(10)
        assert not first.is_alive() and len(slow.stored) == 2
    finally:
        release.set()
        slow.stop()


def test_every_recorded_check_is_sent_on_the_hub(tmp_path: Path, service: Service,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """amp_tutorial.progress.record_attempt hands each new record to the background send."""
    from amp_tutorial import progress

    monkeypatch.setenv("AMP_TUTORIAL_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    monkeypatch.setenv("AMP_PROGRESS_URL", service.url)
    record = progress.record_attempt("01", "autocast_settings", False, ["cpu-float16"], "words")
    assert record is not None
    for _ in range(100):
        if record["id"] in service.stored:
            break
        time.sleep(0.05)
    assert service.stored[record["id"]]["keys"] == ["cpu-float16"]
    monkeypatch.delenv("AMP_PROGRESS_URL")  # off the hub: recorded, not sent
    assert progress.record_attempt("01", "autocast_settings", True, [], "ok") is not None
    time.sleep(0.3)
    assert len(service.stored) == 1 and len(progress.read_attempts()) == 2
