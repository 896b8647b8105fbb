"""The progress service's handlers (docker/hub/amp_progress/service.py), one by one, through
tornado's own test client, with JupyterHub's real HubOAuth asking a stand-in hub about tokens (a
tornado app answering /hub/api/user as the hub does: the token's model with its scopes, 403 for
an unknown token). A browser's sign-in is the cookie HubOAuth itself sets after OAuth, signed with
the app's secret. The rules behind the handlers are tests/unit/test_hub_progress.py; the service
in a real hub is tests/e2e/test_hub.py."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.support import IN_CI
from tests.support.docker_env import HUB_DIR

try:
    from jupyterhub.services.auth import HubOAuth
except ImportError:  # the test group holds JupyterHub (the hub's version): CI has it
    if IN_CI:
        raise
    pytest.skip("JupyterHub is not installed: install the test group (pdm install -G test)",
                allow_module_level=True)

from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402
from tornado.testing import AsyncHTTPTestCase, bind_unused_port, gen_test  # noqa: E402

if str(HUB_DIR) not in sys.path:
    sys.path.insert(0, str(HUB_DIR))
from amp_progress import limits, records, service, store  # noqa: E402
from amp_progress.access import POST_SCOPE, READ_SCOPE  # noqa: E402
from amp_progress.course import COURSE  # noqa: E402

PREFIX = "/services/amp-progress/"
CLIENT_ID = "service-amp-progress"


def learner(name: str) -> dict:
    """A learner's server token's model, as the hub expands its scopes."""
    return {"kind": "user", "name": name, "scopes": [
        POST_SCOPE, f"users:activity!user={name}", f"access:servers!server={name}/"]}


TOKENS = {  # token -> the model the stand-in hub answers with
    "ada-token": learner("ada"), "bob-token": learner("bob"), "eve-token": learner("eve"),
    "teacher-token": {"kind": "user", "name": "teacher", "scopes": [READ_SCOPE]},
    "culler-token": {"kind": "service", "name": "idle-culler", "scopes": [POST_SCOPE]},
}


class StandInHub(web.RequestHandler):
    def get(self) -> None:
        token = self.request.headers.get("Authorization", "").partition(" ")[2]
        self.application.settings["asked"].append(token)
        if token not in TOKENS:
            raise web.HTTPError(403)
        self.finish(TOKENS[token])


def record(exercise: str = "autocast_settings", lesson: str = "01", **fields: object) -> dict:
    return {"id": uuid.uuid4().hex, "time": datetime.now(timezone.utc).isoformat(),
            "lesson": lesson, "exercise": exercise, "passed": False,
            "keys": ["device-type-hard-coded-cuda"], "message": "The device type is 'cuda'.",
            **fields}


def body(*attempts: dict, **top: object) -> bytes:
    return json.dumps({"attempts": list(attempts), **top}).encode()


class ServiceCase(AsyncHTTPTestCase):
    """The real app (service.make_app) on tornado's test server, its store in a temporary
    folder, and a stand-in hub on another port of the same loop."""

    max_rows = limits.MAX_ROWS
    limiter = None

    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.asked: list[str] = []
        hub_socket, self.hub_port = bind_unused_port()
        super().setUp()  # the loop, and the app (get_app)
        self.hub_server = HTTPServer(
            web.Application([(r"/hub/api/user", StandInHub)], asked=self.asked))
        self.hub_server.add_sockets([hub_socket])

    def tearDown(self) -> None:
        self.hub_server.stop()
        super().tearDown()
        if self.service.store is not None:
            self.service.store.close()
        self.service.pool.shutdown()
        self._tmp.cleanup()

    def make_service(self) -> service.Service:
        opened = store.Store(self.tmp / "progress.sqlite")
        return service.Service(opened, max_rows=self.max_rows,
                               limiter=self.limiter or limits.Limiter())

    def get_app(self) -> web.Application:
        self.service = self.make_service()
        self.service.hub_auth = HubOAuth(
            api_url=f"http://127.0.0.1:{self.hub_port}/hub/api", api_token="service-api-token",
            oauth_client_id=CLIENT_ID, base_url=PREFIX, cache_max_age=0,
            login_url="http://127.0.0.1:8000/hub/api/oauth2/authorize")
        self.app = service.make_app(self.service, PREFIX)
        return self.app

    def get_http_server(self) -> HTTPServer:
        return HTTPServer(self._app, max_body_size=service.MAX_STREAM_BYTES)

    def fetch(self, path: str, token: str | None = None, cookie: str | None = None, **kw):
        headers = dict(kw.pop("headers", {}))
        if token:
            headers["Authorization"] = f"token {token}"
        if cookie:
            headers["Cookie"] = cookie
        return super().fetch(path, headers=headers, follow_redirects=False, **kw)

    def post(self, payload: bytes, token: str | None = "ada-token"):
        return self.fetch(PREFIX + "api/attempts", token, method="POST", body=payload)

    def signed_in(self, name: str) -> str:
        """The cookie HubOAuth sets once `name` signed in through the hub (OAuth)."""
        token = f"{name}-token"
        value = web.create_signed_value(self.app.settings["cookie_secret"], CLIENT_ID, token)
        return f"{CLIENT_ID}={value.decode()}"

    def stored(self) -> list[store.Attempt]:
        return self.service.store.attempts()


class TestAttemptsHandler(ServiceCase):
    def test_a_learners_post_is_stored_once_and_acknowledged(self) -> None:
        first, second = record(), record(passed=True, keys=[])
        reply = self.post(body(first, second))
        assert reply.code == 200, reply.body
        assert json.loads(reply.body) == {"stored": 2, "acknowledged": [first["id"], second["id"]]}
        again = self.post(body(first))  # a retry: acknowledged, nothing new
        assert json.loads(again.body) == {"stored": 0, "acknowledged": [first["id"]]}
        assert sorted((a.user, a.id) for a in self.stored()) == sorted(
            [("ada", first["id"]), ("ada", second["id"])])

    def test_only_a_learners_token_may_post(self) -> None:
        for token, status, words in [(None, 401, "token"), ("forged", 401, "token"),
                                     ("teacher-token", 403, "learner"),
                                     ("culler-token", 403, "learner")]:
            reply = self.post(body(record()), token)
            assert reply.code == status and words in json.loads(reply.body)["error"], token
        signed_in = self.fetch(PREFIX + "api/attempts", cookie=self.signed_in("ada"),
                               method="POST", body=body(record()))
        assert signed_in.code == 403 and b"not a browser" in signed_in.body
        assert self.stored() == []

    def test_a_post_for_another_learner_or_beside_the_course_is_refused_with_short_words(
            self) -> None:
        long_name = "x" * 200_000
        for payload, status in [(body(record(), user="bob"), 403),
                                (body(record(), user=long_name), 403),
                                (body(record(exercise="fake_column_0001")), 400),
                                (body(record(keys=["made-up"])), 400)]:
            with self.assertLogs("amp-progress", logging.INFO) as logged:
                reply = self.post(payload)
            assert reply.code == status and len(reply.body) < 300, reply.body[:300]
            assert sum(len(line) for line in logged.output) < 600  # nothing echoed
        assert self.stored() == []

    def test_input_that_passes_validation_never_gets_a_500(self) -> None:
        odd = [record(message="lone \ud800 surrogate"), record(time="0001-01-01T00:00:00+01:00"),
               record(time="9999-12-31T23:59:59-01:00")]
        reply = self.post(body(*odd))
        assert reply.code == 200, reply.body
        now = datetime.now(timezone.utc)
        times = sorted(datetime.fromisoformat(a.time) for a in self.stored())
        assert times[0] > now - records.MAX_AGE - timedelta(minutes=1)  # year 1: a week ago
        assert times[-1] <= now  # the one from the year 9999 is now

    def test_an_oversized_post_gets_413_and_changes_nothing(self) -> None:
        reply = self.post(b" " * (records.MAX_BODY_BYTES + 10))
        assert reply.code == 413 and self.stored() == []

    def test_a_strangers_body_is_dropped_and_a_long_one_refused_from_its_headers(self) -> None:
        """An anonymous post gets 401 once its body (dropped as it comes) is in, so that the
        proxy passes the answer on whole; one longer than MAX_STREAM_BYTES is refused from its
        Content-Length, unread."""
        reply = self.post(b" " * (service.MAX_STREAM_BYTES // 2), token=None)
        assert reply.code == 401 and b"token" in reply.body
        too_long = self.post(b" " * 4 * service.MAX_STREAM_BYTES, token=None)
        assert too_long.code in (400, 599)  # tornado's "Content-Length too long", or cut off

    def test_the_token_is_checked_with_the_hub_and_no_query_token_is_logged(self) -> None:
        with self.assertLogs("amp-progress", logging.INFO) as logged:
            self.fetch(PREFIX + "api/attempts?token=secret-in-url", "ada-token", method="POST",
                       body=body(record()))
        assert self.asked == ["ada-token"]
        assert not [line for line in logged.output if "secret-in-url" in line]
        assert any("POST /services/amp-progress/api/attempts" in line for line in logged.output)


class TestHubDown(ServiceCase):
    def test_when_the_hub_cannot_check_a_token_the_answer_is_503_not_500(self) -> None:
        self.hub_server.stop()
        self.service.hub_auth.api_url = "http://127.0.0.1:9/hub/api"  # nothing listens there
        reply = self.post(body(record()))
        assert reply.code == 503 and int(reply.headers["Retry-After"]) > 0


class TestLimits(ServiceCase):
    max_rows = 5

    def test_a_learner_at_the_row_cap_gets_429_and_nothing_is_stored(self) -> None:
        assert self.post(body(*(record() for _ in range(4)))).code == 200
        over = self.post(body(record(), record()))
        assert over.code == 429 and "most kept" in json.loads(over.body)["error"]
        assert int(over.headers["Retry-After"]) > 0
        assert len(self.stored()) == 4
        assert self.post(body(record()), "bob-token").code == 200  # others go on


class TestRate(ServiceCase):
    limiter = limits.Limiter(posts=limits.Rate(3, 0.01), records=limits.Rate(300, 0.01))

    def test_a_flooder_gets_429_at_once_and_others_go_on(self) -> None:
        codes = [self.post(body(record()), "eve-token").code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        assert self.post(body(record()), "ada-token").code == 200
        flood = self.post(body(*(record() for _ in range(200))), "bob-token")
        flood_again = self.post(body(*(record() for _ in range(200))), "bob-token")
        assert (flood.code, flood_again.code) == (200, 429)
        assert int(flood_again.headers["Retry-After"]) > 0
        assert sum(a.user == "bob" for a in self.stored()) == 200  # nothing of the second


class TestInstructorHandlers(ServiceCase):
    def test_the_page_is_the_instructors_alone(self) -> None:
        self.post(body(record(message="<script>alert(1)</script>")))
        page = self.fetch(PREFIX, "teacher-token")
        assert page.code == 200 and b"&lt;script&gt;alert(1)" in page.body
        assert b"<script>alert(1)" not in page.body
        assert page.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        assert b"setInterval" not in page.body and b"setTimeout(refresh" in page.body
        for path in ("", "table", "attempts.csv"):
            assert self.fetch(PREFIX + path, "ada-token").code == 403
            assert self.fetch(PREFIX + path, cookie=self.signed_in("ada")).code == 403
            stranger = self.fetch(PREFIX + path)
            assert stranger.code == 302 and "oauth2/authorize" in stranger.headers["Location"]

    def test_the_table_and_the_csv(self) -> None:
        first, second = record(), record(passed=True, keys=[])
        self.post(body(first, second))
        table = self.fetch(PREFIX + "table", "teacher-token")
        assert table.code == 200 and b'data-user="ada"' in table.body
        assert b"<html" not in table.body
        export = self.fetch(PREFIX + "attempts.csv", "teacher-token")
        assert export.code == 200 and export.headers["Content-Type"].startswith("text/csv")
        lines = export.body.decode().splitlines()
        assert lines[0].startswith("user,id,time") and len(lines) == 3
        assert first["id"] in lines[1] and second["id"] in lines[2]

    def test_the_summary_quotes_the_course_and_a_learners_words_stay_in_their_row(self) -> None:
        """Eve's server posts a made-up sentence with a real key: the class's summary says the
        key in the course's words, and the sentence shows only in Eve's row, marked as what her
        server sent."""
        prank = "known checker bug, set the default dtype to float16 and re-run"
        assert self.post(body(record(message=prank)), "eve-token").code == 200
        table = self.fetch(PREFIX + "table", "teacher-token").body.decode()
        summary = table[table.index('<ul id="mistakes">'):]
        words = COURSE.words_for(("01", "autocast_settings"), "device-type-hard-coded-cuda")
        assert words and all(html.escape(w) in summary for w in words), summary
        assert "<code>device-type-hard-coded-cuda</code>" in summary and prank not in summary
        eve = table[table.index('data-user="eve"'):]
        assert f"their server sent:</span> <q>{prank}</q>" in eve[:eve.index("</tr>")]
        assert table.count(prank) == 1

    def test_clear_is_the_pages_button_for_the_instructor_only(self) -> None:
        self.post(body(record()))
        ada = self.fetch(PREFIX + "clear", cookie=self.signed_in("ada"), method="POST", body="")
        assert ada.code == 403 and b"for the instructor" in ada.body  # the scope, before XSRF
        token = self.fetch(PREFIX + "clear", "teacher-token", method="POST", body="")
        assert token.code == 403 and b"not an API" in token.body
        teacher = self.signed_in("teacher")
        no_xsrf = self.fetch(PREFIX + "clear", cookie=teacher, method="POST", body="")
        assert no_xsrf.code == 403 and b"_xsrf" in no_xsrf.body
        assert len(self.stored()) == 1
        page = self.fetch(PREFIX, cookie=teacher)
        xsrf = re.search(rb'name="_xsrf" value="([^"]+)"', page.body).group(1).decode()
        jar = SimpleCookie()
        for header in page.headers.get_list("Set-Cookie"):
            jar.load(header)
        cookies = "; ".join([teacher] + [f"{k}={m.value}" for k, m in jar.items()])
        cleared = self.fetch(PREFIX + "clear", cookie=cookies, method="POST",
                             body=urlencode({"_xsrf": xsrf}))
        assert cleared.code == 302 and self.stored() == []


class TestUnreadableStore(ServiceCase):
    def make_service(self) -> service.Service:
        (self.tmp / "file").write_text("a file where the store's folder should be")
        opened, problem = store.open_store(self.tmp / "file/progress.sqlite")
        return service.Service(opened, problem)

    def test_without_a_store_posts_get_503_and_the_page_says_why(self) -> None:
        reply = self.post(body(record()))
        assert reply.code == 503 and int(reply.headers["Retry-After"]) > 0
        page = self.fetch(PREFIX, "teacher-token")
        assert page.code == 200 and b'id="notice"' in page.body
        assert b"could not be opened" in page.body


class TestTheLoopIsNeverBlocked(ServiceCase):
    """A class at the row cap (20 learners x MAX_ROWS rows of the longest words): honest posts
    go on while the page and the CSV are made, and the page stays under a second and small."""

    LEARNERS = 20

    def make_service(self) -> service.Service:
        made = super().make_service()
        words = "w" * records.MAX_MESSAGE
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        for n in range(self.LEARNERS):
            rows = [dict(record(message=words, time=now), keys=["device-type-hard-coded-cuda"])
                    for _ in range(limits.MAX_ROWS)]
            made.store.add(f"learner-{n:02d}", rows, now)
        return made

    @gen_test(timeout=120)
    async def test_honest_posts_are_answered_while_the_page_and_csv_are_made(self) -> None:
        client = self.http_client
        teacher = {"Authorization": "token teacher-token"}

        async def timed(path: str, **kw) -> tuple[float, object]:
            began = time.perf_counter()
            reply = await client.fetch(self.get_url(path), raise_error=False,
                                       request_timeout=60, **kw)
            return time.perf_counter() - began, reply

        page_and_csv = asyncio.gather(timed(PREFIX, headers=teacher),
                                      timed(PREFIX + "attempts.csv", headers=teacher))
        honest = []
        for _ in range(5):
            honest.append(await timed(PREFIX + "api/attempts", method="POST", body=body(record()),
                                      headers={"Authorization": "token ada-token"}))
        (page_s, page), (csv_s, export) = await page_and_csv
        assert [r.code for _, r in honest] == [200] * 5
        assert max(s for s, _ in honest) < 3.0, [s for s, _ in honest]
        assert page.code == 200 and export.code == 200
        rows = self.LEARNERS * limits.MAX_ROWS
        assert rows + 1 <= export.body.count(b"\n") <= rows + 1 + 5  # honest ones: if in time
        flood = await timed(PREFIX + "api/attempts", method="POST", headers={
            "Authorization": "token eve-token"}, body=body(*(record() for _ in range(200))))
        assert flood[1].code == 200
        # The page after honest posts and a flood re-reads only those two learners' rows.
        again_s, again = await timed(PREFIX, headers=teacher)
        assert again_s < 1.0 and len(again.body) < 512 * 1024, (again_s, len(again.body))
        print(f"\n{rows} rows: first page {page_s:.2f} s, CSV {csv_s:.2f} s "
              f"({len(export.body) / 2**20:.1f} MiB), page after a flood {again_s:.3f} s "
              f"({len(again.body) / 1024:.0f} KiB), slowest honest post "
              f"{max(s for s, _ in honest):.3f} s")


class TestTheClientAgainstTheService(ServiceCase):
    """amp_tutorial.class_sync, the learners' client, against the real handlers."""

    @gen_test(timeout=60)
    async def test_a_refused_record_is_set_aside_and_the_rest_arrive_once(self) -> None:
        from amp_tutorial import class_sync

        path = self.tmp / "ada/attempts.jsonl"
        path.parent.mkdir()
        honest = [record(), record(message="lone \ud800 surrogate"), record()]
        poisoned = record(exercise="not_in_the_course")
        with path.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in [honest[0], poisoned, *honest[1:]])
        url = self.get_url(PREFIX + "api/attempts")
        loop = asyncio.get_running_loop()
        sent = await loop.run_in_executor(None, class_sync.send_pending, path, url, "ada-token")
        assert sent == 3
        assert sorted(a.id for a in self.stored()) == sorted(r["id"] for r in honest)
        [aside] = class_sync.refused_path(path).read_text().splitlines()
        assert aside.startswith(f"{poisoned['id']} 400 ") and "course's exercises" in aside
        later = record()
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(later) + "\n")
        again = await loop.run_in_executor(None, class_sync.send_pending, path, url, "ada-token")
        assert again == 1 and len(self.stored()) == 4  # the next attempt arrives, once
