"""Sends a learner's exercise attempts to the workshop hub's progress service (docs/workshop.md).

On the hub, each learner's server has its own token ($JUPYTERHUB_API_TOKEN) and the hub sets
$AMP_PROGRESS_URL; elsewhere (`pdm run lab`, compose) neither is set and nothing is sent. The local
record (amp_tutorial.progress, attempts.jsonl) stays the source: `send_pending` posts the records
the service has not acknowledged yet and writes each acknowledged id to a file beside it
(attempts.sent), so attempts made while the service is down arrive when it is back. The service
stores each record id once, so a retry, or two kernels sending at once, adds no duplicate.

It never stalls: a record the service refuses on its own (400, 413, 422, or a 500 that the
records around it do not get) is set aside with one line in attempts.refused (it stays in the
local record) and the rest go on; a busy or unreachable service (429, 503, no answer) leaves
everything for the next check. Each request has one total deadline, however slowly the reply
trickles in; redirects are not followed (the token goes to the configured address only); one
sync thread runs at a time; lines of the local files that cannot be read are skipped.
Standard library only, and `sync_in_background` never raises: a check never waits for the network
or fails because of it.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

TIMEOUT_S = 3.0  # the whole request: connect, send, and read the reply
BATCH = 100  # records per post; the service takes up to 200 and 256 KiB
MAX_REPLY_BYTES = 1024 * 1024
URL_VARIABLE = "AMP_PROGRESS_URL"
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"
FIELDS = ("id", "time", "lesson", "exercise", "passed", "keys", "message")
REFUSED = {400, 413, 422}  # the service's "this post is wrong": sending it again cannot help
_sending = threading.Lock()  # one send at a time per process
_sync_lock = threading.Lock()
_sync_thread: threading.Thread | None = None
_sync_again = threading.Event()
_sync_path: Path | None = None


class Unsent(Exception):
    """A post that got no acknowledgement: `status` is the HTTP status, or None (no answer)."""

    def __init__(self, status: int | None, why: str) -> None:
        super().__init__(why)
        self.status = status


def sent_path(path: Path) -> Path:
    """The acknowledged ids, one per line, beside the attempts file."""
    return Path(path).with_suffix(".sent")


def refused_path(path: Path) -> Path:
    """The ids the service refused, one line each with why, beside the attempts file."""
    return Path(path).with_suffix(".refused")


def configured() -> bool:
    """Whether this server runs under the hub, with somewhere to send and a token to send with."""
    return bool(os.environ.get(URL_VARIABLE) and os.environ.get(TOKEN_VARIABLE))


def readable_lines(path: Path) -> list[str]:
    """The lines of `path` that are UTF-8 (others skipped); [] when there is no file."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for line in raw.splitlines():
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            continue  # a damaged line: skip it, keep the rest
    return lines


def first_words(lines: list[str]) -> set[str]:
    return {line.split(maxsplit=1)[0] for line in lines if line.strip()}


def pending(path: Path) -> list[dict]:
    """The records in `path` (JSON lines) neither acknowledged nor refused, in order."""
    path = Path(path)
    done = first_words(readable_lines(sent_path(path)) + readable_lines(refused_path(path)))
    records, seen = [], set()
    for line in readable_lines(path):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a full disk: skip it, keep the rest
        if isinstance(record, dict) and isinstance(record.get("id"), str) and record["id"]:
            if record["id"] not in done and record["id"] not in seen and " " not in record["id"]:
                seen.add(record["id"])
                records.append(record)
    return records


def post(url: str, token: str, records: list[dict], timeout: float | None = None) -> list[str]:
    """POST one batch; the ids of the batch that the service acknowledged. Raises Unsent."""
    timeout = TIMEOUT_S if timeout is None else timeout
    body = json.dumps({"attempts": [{k: r.get(k) for k in FIELDS} for r in records]}).encode()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unsent(None, f"{URL_VARIABLE} is not an http(s) URL")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=timeout)
    # One deadline for the whole exchange: past it the socket is shut, which ends any read.
    watchdog = threading.Timer(timeout, _shut, args=(connection,))
    watchdog.daemon = True
    watchdog.start()
    began = time.monotonic()
    try:
        connection.request("POST", parts.path + (f"?{parts.query}" if parts.query else ""),
                           body=body, headers={"Authorization": f"token {token}",
                                               "Content-Type": "application/json"})
        reply = connection.getresponse()  # a redirect is an answer here, never followed
        data = reply.read(MAX_REPLY_BYTES + 1)
        if time.monotonic() - began > timeout:
            raise Unsent(None, "no complete answer in time")
    except (OSError, http.client.HTTPException) as error:
        raise Unsent(None, f"no answer ({type(error).__name__})") from None
    finally:
        watchdog.cancel()
        connection.close()
    if reply.status != 200:
        raise Unsent(reply.status, why_refused(data))
    try:
        answer = json.loads(data)
    except ValueError:
        raise Unsent(None, "the answer is not JSON") from None
    acked = answer.get("acknowledged") if isinstance(answer, dict) else None
    if not isinstance(acked, list):
        raise Unsent(None, "the answer has no list of acknowledged ids")
    ours = {r["id"] for r in records}
    return [i for i in dict.fromkeys(acked) if isinstance(i, str) and i in ours]


def _shut(connection: http.client.HTTPConnection) -> None:
    try:
        if connection.sock is not None:
            connection.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def why_refused(data: bytes) -> str:
    """The service's one-line reason, from its JSON error, cut short."""
    try:
        why = json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        why = ""
    return " ".join(str(why).split())[:200] or "no reason given"


def send_pending(path: Path, url: str | None = None, token: str | None = None) -> int:
    """Send the records of `path` not yet acknowledged; return how many were acknowledged now.

    A batch the service refuses is sent one record at a time: a record refused alone (400, 413,
    422) is set aside in attempts.refused, as is one that gets a 500 alone while another record
    of this call is acknowledged (the service works, that record breaks it). A refused token, a
    limit (429), a service down or slow leaves everything pending for the next call. Raises
    nothing for network trouble.
    """
    url, token = url or os.environ.get(URL_VARIABLE), token or os.environ.get(TOKEN_VARIABLE)
    if not url or not token:
        return 0
    with _sending:
        records = pending(path)
        done, broke = 0, []
        for start in range(0, len(records), BATCH):
            batch = records[start : start + BATCH]
            try:
                acked = post(url, token, batch)
            except Unsent as unsent:
                if unsent.status not in REFUSED and unsent.status != 500:
                    break
                acked, stop = one_by_one(path, url, token, batch, broke)
                if stop:
                    mark_sent(path, acked)
                    done += len(acked)
                    break
            mark_sent(path, acked)
            done += len(acked)
        if done and broke:
            set_aside(path, [(r, 500, "the service failed on this record alone") for r in broke])
        return done


def one_by_one(path: Path, url: str, token: str, batch: list[dict],
               broke: list[dict]) -> tuple[list[str], bool]:
    """Send each record alone: (the acknowledged ids, whether to stop this call)."""
    acked, refused = [], []
    for record in batch:
        try:
            acked += post(url, token, [record])
        except Unsent as unsent:
            if unsent.status in REFUSED:
                refused.append((record, unsent.status, str(unsent)))
            elif unsent.status == 500:
                broke.append(record)
            else:
                set_aside(path, refused)
                return acked, True
    set_aside(path, refused)
    return acked, False


def mark_sent(path: Path, ids: list[str]) -> None:
    if ids:
        with sent_path(path).open("a", encoding="utf-8") as sent:
            sent.writelines(f"{i}\n" for i in ids)


def set_aside(path: Path, refused: list[tuple[dict, int, str]]) -> None:
    """One line per refused record: its id, the status and the service's words."""
    if refused:
        with refused_path(path).open("a", encoding="utf-8") as out:
            out.writelines(f"{r['id']} {status} {' '.join(why.split())}\n"
                           for r, status, why in refused)


def sync_in_background(path: Path) -> threading.Thread | None:
    """Send pending records from a daemon thread, when on the hub; never raises. While one such
    thread runs, a new call asks it to go round once more instead of starting another."""
    global _sync_thread, _sync_path
    if not configured():
        return None
    try:
        with _sync_lock:
            _sync_path = Path(path)
            _sync_again.set()
            if _sync_thread is not None:  # running: it goes round again before it ends
                return _sync_thread
            _sync_thread = threading.Thread(target=_quietly, daemon=True,
                                            name="amp-progress-sync")
            _sync_thread.start()
            return _sync_thread
    except Exception:  # noqa: BLE001 -- a check's answer matters more than its sending
        return None


def _quietly() -> None:
    global _sync_thread
    while True:
        with _sync_lock:
            if not _sync_again.is_set():
                _sync_thread = None  # under the lock: a later call starts a new thread
                return
            _sync_again.clear()
            path = _sync_path
        try:
            send_pending(path)
        except Exception:  # noqa: BLE001
            pass
