"""amp_tutorial.class_sync against a stand-in for the hub's progress service (a local HTTP server
that keeps ids once per token, refuses a record without a lesson with 400, a wrong token with 403,
and can be down): what is sent, once, and what waits for the service."""

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
    def __init__(self) -> None:
        self.stored: dict[str, dict] = {}
        self.posts = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                service.posts += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"token {TOKEN}":
                    return self.reply(403, {"error": "not your token"})
                records = body["attempts"]
                if any("lesson" not in r or r["lesson"] is None for r in records):
                    return self.reply(400, {"error": "lesson missing"})
                for r in records:
                    service.stored.setdefault(r["id"], r)
                self.reply(200, {"acknowledged": [r["id"] for r in records]})

            def reply(self, status: int, data: dict) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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


def attempt(lesson: str | None = "01") -> dict:
    return {"id": uuid.uuid4().hex, "time": "2026-11-26T00:00:00+00:00", "lesson": lesson,
            "exercise": "autocast_settings", "passed": False, "keys": ["cpu-float16"],
            "message": "float16 on the CPU"}


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
    assert class_sync.send_pending(path, service.url, TOKEN) == 2  # good sent, bad given up
    assert list(service.stored) == [good["id"]] and class_sync.pending(path) == []


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
