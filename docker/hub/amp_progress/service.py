"""The class's progress, a JupyterHub service: learners' servers post attempts, the instructor
reads the page (docker/hub/jupyterhub_config.py starts it; docs/workshop.md says what it keeps).

Routes under $JUPYTERHUB_SERVICE_PREFIX (/services/amp-progress/):
  POST api/attempts   a learner's server, with its own $JUPYTERHUB_API_TOKEN; the body is checked
                      by records, the user is the token's (access), the learner's limits by
                      limits; stored once per record id. Answers {"stored": new,
                      "acknowledged": [ids]}; 400/403/413 for a post to refuse, 429 over a limit,
                      503 without a store. Nothing is stored unless the answer is 200.
  GET  ""             the instructor's page (browser sign-in through the hub, HubOAuth)
  GET  table          the page's grid, fetched by the page after each refresh ends
  GET  attempts.csv   every attempt, streamed in pieces, for the instructor
  POST clear          deletes every attempt, for the instructor, from the page only
The event loop never waits for SQLite or for rendering: the hub's answer about a token is awaited,
and the store, the view and the CSV run on a small thread pool; the view is computed once per
change of the table. Run as `python -m amp_progress`; $AMP_PROGRESS_DB is the SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import httpserver, ioloop, web

from amp_progress.access import POST_SCOPE, READ_SCOPE, learner_of, may_read
from amp_progress.limits import MAX_ROWS, Limiter
from amp_progress.records import MAX_BODY_BYTES, BadPost, parse_post
from amp_progress.store import CSV_FIELDS, Full, Store, open_store
from amp_progress.view import ClassView, LearnerPart, combine, learner_part, render_page, table_html

log = logging.getLogger("amp-progress")
MAX_STREAM_BYTES = 1024 * 1024  # read (and dropped) before a clean 413 or 401; past it, cut off
BODY_TIMEOUT_S = 10  # a post's body must arrive within this
DEFAULT_DB = "/srv/jupyterhub/progress.sqlite"
CACHE_MAX_AGE_S = 5  # how long the hub's answer about a token is trusted (a deleted learner's
# token stops posting within this)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Service:
    """What the handlers share: the store (None when it could not be opened, `problem` says why),
    the learners' limits, the thread pool and the last computed view."""

    store: Store | None
    problem: str = ""
    hub_auth: HubOAuth | None = None  # the hub's HubOAuth (main), or one pointed at a test hub
    limiter: Limiter = field(default_factory=Limiter)
    max_rows: int = MAX_ROWS
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="amp-progress"))
    _parts: dict[str, LearnerPart] = field(default_factory=dict)
    _seen: int = -1
    _view: ClassView | None = None
    _view_lock: threading.Lock = field(default_factory=threading.Lock)

    async def off_loop(self, function, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)

    def view(self) -> ClassView:
        """The class view (on the pool's threads): only the learners whose attempts changed
        since the last view are read again, so one learner's flood costs at most their rows."""
        with self._view_lock:
            if self.store is None:
                return combine([], utc_now())
            if self._seen < 0:  # the first view: everyone
                version, users = self.store.version, self.store.users()
                self._parts = {}
            else:
                version, cleared, users = self.store.changes_since(self._seen)
                if cleared:
                    self._parts, users = {}, self.store.users()
            for user in users:
                self._parts[user] = learner_part(user, self.store.attempts_of(user))
            if self._view is None or version != self._seen:
                self._view = combine(self._parts.values(), utc_now())
                self._seen = version
            return self._view


class Handler(HubOAuthenticated, web.RequestHandler):
    def initialize(self, service: Service) -> None:
        self.service = service
        if service.hub_auth is not None:
            self.hub_auth = service.hub_auth

    async def prepare(self) -> None:
        """Ask the hub who the token or cookie belongs to without blocking the loop (the sync
        get_current_user that tornado calls afterwards reads this answer)."""
        try:
            await self.hub_auth.get_user(self, sync=False)
        except web.HTTPError as error:  # the hub did not answer: busy, not broken, so try later
            log.warning("the hub could not say who a token belongs to: %s", error.log_message)
            raise refuse(503, "the hub cannot check tokens now; try later", 30) from None

    def set_default_headers(self) -> None:
        # The page's Clear button is not to be clicked through a frame of another site.
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Content-Security-Policy", "frame-ancestors 'none'")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")

    def write_error(self, status_code: int, **kwargs) -> None:
        """Plain words, never a traceback."""
        error = kwargs.get("exc_info", (None, None))[1]
        why = (
            error.log_message
            if isinstance(error, web.HTTPError) and error.log_message
            else self._reason
        )
        if getattr(error, "retry_after", None):  # 429, 503: when to try again
            self.set_header("Retry-After", str(max(1, round(error.retry_after))))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "error": why}))


def refuse(status: int, why: str, retry_after: float | None = None) -> web.HTTPError:
    error = web.HTTPError(status, why)
    error.retry_after = retry_after
    return error


@web.stream_request_body
class AttemptsHandler(Handler):
    """A learner's server posts its attempts here, with its token. Who posts, and whether they
    may now, is decided before the body is read; the body is then read as it comes and kept only
    when they may, up to MAX_BODY_BYTES. A refused or too long body is read to its end and dropped
    before the answer, so that the proxy passes on a clean 401/413/429, not a broken connection
    (an answer sent while the proxy still writes the body reached the client as the proxy's 503).
    Past MAX_STREAM_BYTES the server closes the connection."""

    hub_scopes = None  # every identified token comes in; access.learner_of decides

    def check_xsrf_cookie(self) -> None:
        """No XSRF check: only token-authenticated posts are taken (a browser's cookie is not)."""

    async def prepare(self) -> None:
        self.body, self.too_big, self.user = bytearray(), 0, None
        self.refusal: web.HTTPError | None = None
        try:
            await super().prepare()
            self.user = self.learner()
        except web.HTTPError as error:  # answered once the body is in: see the class's words
            self.refusal = error

    def learner(self) -> str:
        """Who posts, if they may post now; raises the refusal otherwise."""
        model = self.current_user
        if model is None:
            raise refuse(401, "post with a learner server's token (Authorization: token)")
        if not getattr(self, "_token_authenticated", False):
            raise refuse(403, "post with a token, not a browser's sign-in")
        user = learner_of(model)
        if user is None:
            raise refuse(403, f"this token is not a learner's with {POST_SCOPE}")
        if self.service.store is None:
            raise refuse(503, "the class's record is not available; try later", 60)
        wait = self.service.limiter.post(user)
        if wait:
            raise refuse(429, "too many posts from this learner; try later", wait)
        return user

    def data_received(self, chunk: bytes) -> None:
        if self.user is None or self.too_big or len(self.body) + len(chunk) > MAX_BODY_BYTES:
            self.too_big += len(chunk)  # refused already, or too long: dropped as it comes
        else:
            self.body += chunk

    async def post(self) -> None:
        if self.refusal is not None:
            raise self.refusal
        user = self.user
        if self.too_big:
            raise refuse(413, f"the post is over {MAX_BODY_BYTES} bytes")
        try:
            records = parse_post(bytes(self.body), user)
        except BadPost as refused:
            log.warning("refused a post by %s: %d", user, refused.status)  # never its content
            raise refuse(refused.status, str(refused)) from None
        wait = self.service.limiter.records_of(user, len(records))
        if wait:
            raise refuse(429, "too many attempts from this learner at once; try later", wait)
        try:
            stored = await self.service.off_loop(
                self.service.store.add, user, records, utc_now().isoformat(timespec="seconds"),
                self.service.max_rows)
        except Full:
            log.warning("refused a post by %s: %d attempts kept already", user,
                        self.service.max_rows)
            raise refuse(429, f"this learner has {self.service.max_rows} attempts recorded, "
                         "the most kept per learner; the instructor's Clear empties it",
                         3600) from None
        except (sqlite3.Error, OSError) as error:
            log.error("could not store a post by %s: %s", user, error)
            raise refuse(503, "the class's record cannot be written now; try later", 60) from None
        self.finish({"stored": stored, "acknowledged": [r["id"] for r in records]})

class InstructorHandler(Handler):
    """The pages only READ_SCOPE reaches; anyone else signed in gets 403."""

    hub_scopes = {READ_SCOPE}

    async def prepare(self) -> None:
        await super().prepare()
        model = getattr(self, "_cached_hub_user", None)  # whom the hub named, allowed or not
        if model is not None and not may_read(model):
            raise web.HTTPError(403, "the class's progress is for the instructor")
        if model is None and self.request.method not in ("GET", "HEAD"):
            # a token the hub names no user for here (a learner's lacks this service's scopes):
            # refused in the same words, rather than tornado's bare "Forbidden" for a POST
            raise web.HTTPError(403, "the class's progress is for the instructor")


class PageHandler(InstructorHandler):
    @web.authenticated
    async def get(self) -> None:
        now, service = utc_now(), self.service
        view = await service.off_loop(service.view)
        page = await service.off_loop(render_page, view, now, self.current_user["name"],
                                      self.settings["prefix"], self.xsrf_form_html(),
                                      service.problem)
        self.finish(page)


class TableHandler(InstructorHandler):
    @web.authenticated
    async def get(self) -> None:
        now, service = utc_now(), self.service
        view = await service.off_loop(service.view)
        self.finish(await service.off_loop(table_html, view, now))


class CsvHandler(InstructorHandler):
    @web.authenticated
    async def get(self) -> None:
        stamp = utc_now().strftime("%Y%m%d-%H%M%S")
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="attempts-{stamp}.csv"')
        store = self.service.store
        pieces = iter(store.csv_pieces() if store else [",".join(CSV_FIELDS) + "\r\n"])
        while (piece := await self.service.off_loop(next, pieces, None)) is not None:
            self.write(piece)
            await self.flush()  # one piece in memory at a time
        self.finish()


class ClearHandler(InstructorHandler):
    """Clear: a button on the instructor's page. Its XSRF check comes after the scope's (a
    learner gets 403 for who they are, whatever they send), and no token may clear."""

    _xsrf_due = False

    def check_xsrf_cookie(self) -> None:
        if self._xsrf_due:
            super().check_xsrf_cookie()

    @web.authenticated
    async def post(self) -> None:
        if getattr(self, "_token_authenticated", False):
            raise web.HTTPError(403, "Clear is the page's button, not an API for tokens")
        self._xsrf_due = True
        self.check_xsrf_cookie()
        if self.service.store is None:
            raise web.HTTPError(503, "the class's record is not available")
        deleted = await self.service.off_loop(self.service.store.clear)
        log.warning("%s cleared %d attempts", self.current_user["name"], deleted)
        self.redirect(self.settings["prefix"])


def log_request(handler: web.RequestHandler) -> None:
    """One line per request: status, method, path (never the query: it may hold ?token=), time."""
    request = handler.request
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    log.log(level, "%d %s %s %.1f ms", status, request.method, request.path[:200],
            1000 * request.request_time())


def make_app(service: Service, prefix: str) -> web.Application:
    handlers = [
        (prefix, PageHandler),
        (url_path_join(prefix, "table"), TableHandler),
        (url_path_join(prefix, "attempts.csv"), CsvHandler),
        (url_path_join(prefix, "clear"), ClearHandler),
        (url_path_join(prefix, "api/attempts"), AttemptsHandler),
    ]
    return web.Application(
        [(path, handler, {"service": service}) for path, handler in handlers]
        + [(url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler)],
        cookie_secret=secrets.token_bytes(32),  # the hub signs the user in again after a restart
        xsrf_cookies=True,
        prefix=prefix,
        log_function=log_request,
    )


def serve(service: Service, prefix: str, host: str, port: int) -> httpserver.HTTPServer:
    server = httpserver.HTTPServer(
        make_app(service, prefix), xheaders=True, max_body_size=MAX_STREAM_BYTES,
        body_timeout=BODY_TIMEOUT_S, idle_connection_timeout=60,
    )
    server.listen(port, host)
    return server


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s %(asctime)s] %(message)s")
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/amp-progress/")
    hub_auth = HubOAuth.instance(cache_max_age=CACHE_MAX_AGE_S)  # configured from the hub's env
    store, problem = open_store(os.environ.get("AMP_PROGRESS_DB", DEFAULT_DB))
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    shared = Service(store, problem, hub_auth=hub_auth)
    serve(shared, prefix, url.hostname, url.port)
    shared.pool.submit(shared.view)  # the first page finds the class read already
    if store is None:
        log.error("progress service on %s WITHOUT a store: %s", url.geturl(), problem)
    else:
        log.info("progress service on %s, %d attempts in %s", url.geturl(), store.count(),
                 store.path)
    ioloop.IOLoop.current().start()
