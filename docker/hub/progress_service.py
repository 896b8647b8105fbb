"""The class's progress, a JupyterHub service: learners' servers post attempts, the instructor
reads the page (docker/hub/jupyterhub_config.py starts it; docs/workshop.md says what it keeps).

Routes under $JUPYTERHUB_SERVICE_PREFIX (/services/amp-progress/):
  POST api/attempts   a learner's server, with its own $JUPYTERHUB_API_TOKEN; the body is checked
                      by progress_input, the user is the token's (progress_access); stored once
                      per record id. Answers {"stored": new, "acknowledged": [ids]}.
  GET  ""             the instructor's page (browser sign-in through the hub, HubOAuth)
  GET  table          the page's grid, fetched by the page every few seconds
  GET  attempts.csv   every attempt, for the instructor
  POST clear          deletes every attempt, for the instructor
Run as `python progress_service.py`; $AMP_PROGRESS_DB is the SQLite file (on the hub's volume).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from datetime import datetime, timezone
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from progress_access import POST_SCOPE, READ_SCOPE, learner_of, may_read
from progress_input import MAX_BODY_BYTES, BadPost, parse_post
from progress_store import Store
from progress_view import class_view, render_page, table_html
from tornado import httpserver, ioloop, web

log = logging.getLogger("amp-progress")
MAX_STREAM_BYTES = 16 * 1024 * 1024  # read (and dropped) before a clean 413; past it, cut off


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Handler(HubOAuthenticated, web.RequestHandler):
    def initialize(self, store: Store) -> None:
        self.store = store

    def write_error(self, status_code: int, **kwargs) -> None:
        """Plain words, never a traceback."""
        error = kwargs.get("exc_info", (None, None))[1]
        why = (
            error.log_message
            if isinstance(error, web.HTTPError) and error.log_message
            else (self._reason)
        )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "error": why}))


@web.stream_request_body
class AttemptsHandler(Handler):
    """A learner's server posts its attempts here, with its token. The body is read as it comes
    and kept only up to MAX_BODY_BYTES: a longer post is read to its end (so that the proxy passes
    on a clean 413, not a broken connection) but never held in memory. Past MAX_STREAM_BYTES the
    server closes the connection."""

    hub_scopes = None  # every identified token comes in; progress_access.learner_of decides

    def prepare(self) -> None:
        self.body, self.too_big = bytearray(), 0

    def data_received(self, chunk: bytes) -> None:
        if self.too_big or len(self.body) + len(chunk) > MAX_BODY_BYTES:
            self.too_big += len(chunk)
        else:
            self.body += chunk

    def check_xsrf_cookie(self) -> None:
        """No XSRF check: only token-authenticated posts are taken (a browser's cookie is not)."""

    def post(self) -> None:
        model = self.current_user
        if model is None:
            raise web.HTTPError(401, "post with a learner server's token (Authorization: token)")
        if not getattr(self, "_token_authenticated", False):
            raise web.HTTPError(403, "post with a token, not a browser's sign-in")
        user = learner_of(model)
        if user is None:
            raise web.HTTPError(403, f"this token is not a learner's with {POST_SCOPE}")
        if self.too_big:
            raise web.HTTPError(413, f"the post is over {MAX_BODY_BYTES} bytes")
        try:
            records = parse_post(bytes(self.body), user)
        except BadPost as refused:
            log.warning("refused a post by %s: %s", user, refused)
            raise web.HTTPError(refused.status, str(refused)) from None
        stored = self.store.add(user, records, utc_now().isoformat(timespec="seconds"))
        self.finish({"stored": stored, "acknowledged": [r["id"] for r in records]})


class InstructorHandler(Handler):
    """The pages only READ_SCOPE reaches; anyone else signed in gets 403."""

    hub_scopes = {READ_SCOPE}

    def prepare(self) -> None:
        if self.current_user is not None and not may_read(self.current_user):
            raise web.HTTPError(403, "the class's progress is for the instructor")


class PageHandler(InstructorHandler):
    @web.authenticated
    def get(self) -> None:
        now = utc_now()
        self.set_header("Cache-Control", "no-store")
        self.finish(
            render_page(
                class_view(self.store.attempts(), now),
                now,
                self.current_user["name"],
                self.settings["prefix"],
                self.xsrf_form_html(),
            )
        )


class TableHandler(InstructorHandler):
    @web.authenticated
    def get(self) -> None:
        now = utc_now()
        self.set_header("Cache-Control", "no-store")
        self.finish(table_html(class_view(self.store.attempts(), now), now))


class CsvHandler(InstructorHandler):
    @web.authenticated
    def get(self) -> None:
        stamp = utc_now().strftime("%Y%m%d-%H%M%S")
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="attempts-{stamp}.csv"')
        self.finish(self.store.to_csv())


class ClearHandler(InstructorHandler):
    @web.authenticated
    def post(self) -> None:
        deleted = self.store.clear()
        log.warning("%s cleared %d attempts", self.current_user["name"], deleted)
        self.redirect(self.settings["prefix"])


def make_app(store: Store, prefix: str) -> web.Application:
    handlers = [
        (prefix, PageHandler),
        (url_path_join(prefix, "table"), TableHandler),
        (url_path_join(prefix, "attempts.csv"), CsvHandler),
        (url_path_join(prefix, "clear"), ClearHandler),
        (url_path_join(prefix, "api/attempts"), AttemptsHandler),
    ]
    return web.Application(
        [(path, handler, {"store": store}) for path, handler in handlers]
        + [(url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler)],
        cookie_secret=secrets.token_bytes(32),  # the hub signs the user in again after a restart
        xsrf_cookies=True,
        prefix=prefix,
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s %(asctime)s] %(message)s")
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/amp-progress/")
    HubOAuth.instance(cache_max_age=60)  # the handlers' HubOAuth, configured from the hub's env
    store = Store(os.environ.get("AMP_PROGRESS_DB", "/srv/jupyterhub/progress.sqlite"))
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    server = httpserver.HTTPServer(
        make_app(store, prefix), xheaders=True, max_body_size=MAX_STREAM_BYTES
    )
    server.listen(url.port, url.hostname)
    log.info("progress service on %s, %d attempts in %s", url.geturl(), store.count(), store.path)
    ioloop.IOLoop.current().start()


if __name__ == "__main__":
    main()
