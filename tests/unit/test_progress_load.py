"""scripts/progress_load.py without a hub: the attempts it posts are ones the service accepts (the
honest class's, the flooder's largest post, the poisoned one), and its percentile is the one it
reports. The run against a real hub is in tests/e2e/test_hub.py (docs/workshop.md gives its
figures)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

from tests.support import load_program
from tests.support.docker_env import HUB_DIR

progress_load = load_program("progress_load")
if str(HUB_DIR) not in sys.path:
    sys.path.insert(0, str(HUB_DIR))
from amp_progress import records as progress_input  # noqa: E402


def test_every_simulated_attempt_is_one_the_service_accepts() -> None:
    attempts = [progress_load.attempt(n) for n in range(progress_load.ATTEMPTS)]
    body = json.dumps({"attempts": attempts}).encode()
    checked = progress_input.parse_post(body, "load-00", now=datetime.now(timezone.utc))
    assert len({a["id"] for a in checked}) == progress_load.ATTEMPTS
    assert {a["passed"] for a in checked} == {True, False}
    assert len({a["exercise"] for a in checked}) == 5  # the simulated class moves on


def test_the_flood_and_the_poison_are_posts_the_service_takes_whole() -> None:
    """The flooder's post is the largest the service takes (so its 429s are the limits', not a
    400), and the poisoned records pass the checks (so a 500 would be the service's fault)."""
    now = datetime.now(timezone.utc)
    flood = json.dumps(progress_load.flood_post()).encode()
    assert len(progress_input.parse_post(flood, "flood-00", now=now)) == (
        progress_input.MAX_RECORDS)
    poison = json.dumps({"attempts": progress_load.poisoned()}).encode()
    checked = progress_input.parse_post(poison, "load-00", now=now)
    assert "\ufffd" in checked[0]["message"] and checked[2]["time"] <= now.isoformat()


def test_the_95th_percentile() -> None:
    assert progress_load.quantile([float(i) for i in range(1, 101)], 0.95) == 96.0
    assert progress_load.quantile([3.0], 0.95) == 3.0
