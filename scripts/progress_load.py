"""Load on the workshop hub's progress service: a class posting at once, then the page's time.

    python scripts/progress_load.py --hub http://127.0.0.1:8000 --token ADMIN_TOKEN

Run it against a hub without a class (a rehearsal hub: it adds users load-00, load-01, ...).
It creates LEARNERS users through the hub's API, gives each a token with only the post scope (as
a learner's server has), and starts them together: each checks ATTEMPTS times, and each check
posts the new attempt together with the one before (as a client whose acknowledgement was lost
sends it again), so every attempt arrives twice. Then it reads the CSV export and checks that each
attempt is stored exactly once, times the instructor's page (read with the admin's token) and
deletes the users; their attempts stay until the instructor clears them on the page.
ADMIN_TOKEN: a token of the hub's admin (/hub/token). It exits 1 when a post failed, an attempt
is missing or stored twice, or the page took a second or more.
Standard library only; prints one table, or JSON with --json.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone

LEARNERS = 40
ATTEMPTS = 50
PAGE_READS = 10
POST_SCOPE = "custom:amp-progress:post"
SERVICE = "/services/amp-progress/"
MISTAKES = [
    ("device-type-hard-coded-cuda", "The device type is always 'cuda'."),
    ("cpu-float16", "On the CPU autocast takes bfloat16."),
    ("wrong-order", "Order."),
]


def call(
    method: str, url: str, token: str, body: object = None, timeout: float = 30
) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one request with a token."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"token {token}"}
    )
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read(), time.perf_counter() - began
    except urllib.error.HTTPError as error:
        return error.code, error.read(), time.perf_counter() - began


def attempt(number: int) -> dict:
    passed = number % 5 == 4
    key, words = MISTAKES[number % len(MISTAKES)]
    return {
        "id": uuid.uuid4().hex,
        "time": datetime.now(timezone.utc).isoformat(),
        "lesson": f"{1 + number // 10:02d}",
        "exercise": "load_exercise",
        "passed": passed,
        "keys": [] if passed else [key],
        "message": "All checks passed." if passed else words,
    }


def learner(
    hub: str,
    token: str,
    attempts: int,
    start: threading.Barrier,
    sent: list[dict],
    latencies: list[float],
    failures: list[str],
) -> None:
    start.wait()
    before: list[dict] = []
    for number in range(attempts):
        new = attempt(number)
        status, body, seconds = call(
            "POST", hub + SERVICE + "api/attempts", token, {"attempts": before + [new]}
        )
        latencies.append(seconds)
        if status != 200:
            failures.append(f"{status}: {body[:200]!r}")
        sent.append(new)
        before = [new]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hub", default="http://127.0.0.1:8000")
    parser.add_argument(
        "--token",
        default=os.environ.get("AMP_HUB_ADMIN_TOKEN"),
        help="an admin's API token (default: $AMP_HUB_ADMIN_TOKEN)",
    )
    parser.add_argument("--learners", type=int, default=LEARNERS)
    parser.add_argument("--attempts", type=int, default=ATTEMPTS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.token:
        parser.error("give --token (or $AMP_HUB_ADMIN_TOKEN): an admin's token, from /hub/token")
    hub, admin = args.hub.rstrip("/"), args.token
    names = [f"load-{i:02d}" for i in range(args.learners)]
    status, body, _ = call("POST", hub + "/hub/api/users", admin, {"usernames": names})
    if status not in (201, 409):
        raise SystemExit(f"cannot create the load users: {status} {body[:300]!r}")
    tokens = {}
    for name in names:
        status, body, _ = call(
            "POST",
            f"{hub}/hub/api/users/{name}/tokens",
            admin,
            {"scopes": [POST_SCOPE], "expires_in": 3600, "note": "load"},
        )
        if status != 201:
            raise SystemExit(f"cannot make {name}'s token: {status} {body[:300]!r}")
        tokens[name] = json.loads(body)["token"]

    sent: dict[str, list[dict]] = {name: [] for name in names}
    latencies: list[float] = []
    failures: list[str] = []
    start = threading.Barrier(len(names) + 1)
    threads = [
        threading.Thread(
            target=learner,
            args=(hub, tokens[n], args.attempts, start, sent[n], latencies, failures),
        )
        for n in names
    ]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began

    status, body, _ = call("GET", hub + SERVICE + "attempts.csv", admin)
    if status != 200:
        raise SystemExit(f"cannot read the CSV export: {status} {body[:300]!r}")
    rows = [r for r in csv.DictReader(io.StringIO(body.decode())) if r["user"] in sent]
    stored = [(r["user"], r["id"]) for r in rows]
    expected = {(name, r["id"]) for name, records in sent.items() for r in records}
    page_times = []
    for _ in range(PAGE_READS):
        status, body, seconds = call("GET", hub + SERVICE, admin)
        if status != 200 or b"load-00" not in body:
            raise SystemExit(f"the page did not answer with the class: {status}")
        page_times.append(seconds)
    for name in names:
        call("DELETE", f"{hub}/hub/api/users/{name}", admin)

    posts = len(latencies)
    result = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "learners": len(names),
        "attempts_each": args.attempts,
        "posts": posts,
        "failed_posts": len(failures),
        "attempts_sent_twice": len(expected),
        "rows_stored": len(stored),
        "stored_exactly_once": len(stored) == len(set(stored)) and set(stored) == expected,
        "wall_s": round(wall, 2),
        "posts_per_s": round(posts / wall, 1),
        "post_median_ms": round(1000 * statistics.median(latencies), 1),
        "post_p95_ms": round(1000 * quantile(latencies, 0.95), 1),
        "post_max_ms": round(1000 * max(latencies), 1),
        "page_median_ms": round(1000 * statistics.median(page_times), 1),
        "page_max_ms": round(1000 * max(page_times), 1),
        "page_under_1s": max(page_times) < 1.0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:22} {value}")
        if failures:
            print("first failures:", *failures[:5], sep="\n  ")
    if failures or not result["stored_exactly_once"] or not result["page_under_1s"]:
        raise SystemExit(1)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
