"""scripts/progress_load.py without a hub: the attempts it posts are ones the service accepts,
and its percentile is the one it reports. The run against a hub is a benchmark, not a test
(docs/workshop.md gives its figures)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

from tests.support import load_program
from tests.support.docker_env import HUB_DIR

progress_load = load_program("progress_load")
sys.path.insert(0, str(HUB_DIR))
import progress_input  # noqa: E402


def test_every_simulated_attempt_is_one_the_service_accepts() -> None:
    attempts = [progress_load.attempt(n) for n in range(progress_load.ATTEMPTS)]
    body = json.dumps({"attempts": attempts}).encode()
    checked = progress_input.parse_post(body, "load-00", now=datetime.now(timezone.utc))
    assert len({a["id"] for a in checked}) == progress_load.ATTEMPTS
    assert {a["passed"] for a in checked} == {True, False}
    assert len({a["lesson"] for a in checked}) == 5  # the simulated class moves on


def test_the_95th_percentile() -> None:
    assert progress_load.quantile([float(i) for i in range(1, 101)], 0.95) == 96.0
    assert progress_load.quantile([3.0], 0.95) == 3.0
