"""Sends a learner's exercise attempts to the workshop hub's progress service (docs/workshop.md).

On the hub, each learner's server has its own token ($JUPYTERHUB_API_TOKEN) and the hub sets
$AMP_PROGRESS_URL; elsewhere (`pdm run lab`, compose) neither is set and nothing is sent. The local
record (amp_tutorial.progress, attempts.jsonl) stays the source: `send_pending` posts the records
the service has not acknowledged yet and writes each acknowledged id to a file beside it
(attempts.sent), so attempts made while the service is down arrive when it is back. The service
stores each record id once, so a retry, or two kernels sending at once, adds no duplicate.
Standard library only, a short timeout, and `sync_in_background` never raises: a check never
waits for the network or fails because of it.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 3.0
BATCH = 200  # records per post; the service takes up to 500 and 256 KiB
URL_VARIABLE = "AMP_PROGRESS_URL"
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"
_sending = threading.Lock()  # one send at a time per process


def sent_path(path: Path) -> Path:
    """The acknowledged ids, one per line, beside the attempts file."""
    return Path(path).with_suffix(".sent")


def configured() -> bool:
    """Whether this server runs under the hub, with somewhere to send and a token to send with."""
    return bool(os.environ.get(URL_VARIABLE) and os.environ.get(TOKEN_VARIABLE))


def pending(path: Path) -> list[dict]:
    """The records in `path` (JSON lines) whose ids the service has not acknowledged, in order."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    try:
        acked = set(sent_path(path).read_text(encoding="utf-8").split())
    except FileNotFoundError:
        acked = set()
    records, seen = [], set()
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a full disk: skip it, keep the rest
        if isinstance(record, dict) and isinstance(record.get("id"), str):
            if record["id"] not in acked and record["id"] not in seen:
                seen.add(record["id"])
                records.append(record)
    return records


FIELDS = ("id", "time", "lesson", "exercise", "passed", "keys", "message")


def post(url: str, token: str, records: list[dict]) -> list[str]:
    """POST one batch; the ids the service acknowledged. Raises urllib's errors."""
    body = json.dumps({"attempts": [{k: r.get(k) for k in FIELDS} for r in records]}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
        return list(json.load(reply).get("acknowledged", []))


def send_pending(path: Path, url: str | None = None, token: str | None = None) -> int:
    """Send the records of `path` not yet acknowledged; return how many were acknowledged now.

    A record the service refuses on its own (HTTP 400) is marked sent too, so one bad line
    cannot hold back the others; a refused token (401, 403) or an unreachable service leaves
    everything pending for the next call. Raises nothing for network trouble; returns 0.
    """
    url, token = url or os.environ.get(URL_VARIABLE), token or os.environ.get(TOKEN_VARIABLE)
    if not url or not token:
        return 0
    with _sending:
        records = pending(path)
        done = 0
        for start in range(0, len(records), BATCH):
            batch = records[start : start + BATCH]
            try:
                acked = post(url, token, batch)
            except urllib.error.HTTPError as refused:
                if refused.code != 400:
                    break
                acked = [r["id"] for r in batch if single_refused(url, token, r)]
            except (OSError, ValueError):  # unreachable, timed out, a reply that is not JSON
                break
            with sent_path(path).open("a", encoding="utf-8") as sent:
                sent.writelines(f"{i}\n" for i in acked)
            done += len(acked)
        return done


def single_refused(url: str, token: str, record: dict) -> bool:
    """Send one record alone: True once the service took it or refused it as malformed."""
    try:
        return bool(post(url, token, [record]))
    except urllib.error.HTTPError as refused:
        return refused.code == 400
    except (OSError, ValueError):
        return False


def sync_in_background(path: Path) -> threading.Thread | None:
    """Send pending records from a daemon thread, when on the hub; never raises."""
    if not configured():
        return None
    try:
        thread = threading.Thread(
            target=_quietly, args=(Path(path),), daemon=True, name="amp-progress-sync"
        )
        thread.start()
        return thread
    except Exception:  # noqa: BLE001 -- a check's answer matters more than its sending
        return None


def _quietly(path: Path) -> None:
    try:
        send_pending(path)
    except Exception:  # noqa: BLE001
        pass
