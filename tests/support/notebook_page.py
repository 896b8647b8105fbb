"""What a notebook page shows per code cell, read in headless Chromium: in JupyterLab after Run
All (``tests/e2e/test_browser.py``) and in the pages the handout renders
(``tests/e2e/test_handout.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Locator

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
