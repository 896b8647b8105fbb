"""The course in a real browser, as a learner uses it: open the lab, double-click a lesson, Run All.

JupyterLab is started with ``pdm run lab``'s command (on a copy of notebooks/, so autosave cannot
touch the checkout) and driven with headless Chromium through the playwright package. Debian's
``/usr/bin/chromium`` is used; never ``playwright install``. Without it these tests skip, except
under ``CI=true``, where that is a failure. A screenshot of each finished lesson is saved under
``artifacts/browser/`` and its path printed.
"""

from __future__ import annotations

import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import jupytext
import pytest
from playwright.sync_api import Browser, Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from amp_tutorial import select_device
from amp_tutorial.device import DeviceInfo, dtype_name, fp32_baseline
from course_tools.answers import use_solutions
from course_tools.catalogue import lesson_paths, notebooks_dir
from tests.support import ROOT, SOLUTIONS
from tests.support.lab_server import LabServer, start_lab
from tests.support.notebook_page import FIGURE_CELL, UI_TIMEOUT_MS, Cell, read_cells

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "artifacts" / "browser"
VIEWPORT = {"width": 1400, "height": 900}
RUN_ALL_TIMEOUT_MS = 300_000  # a whole lesson at the smoke preset: 10-30 s here
# Run All is over when the first cell has run, no cell is running or queued ([*]), and the kernel
# is idle. This holds whether every cell ran or an error stopped the run (the rest stay [ ]).
RUN_FINISHED_JS = """(panel) => {
  const prompts = Array.from(panel.querySelectorAll(".jp-CodeCell .jp-InputArea-prompt"),
                             (p) => p.textContent.trim());
  const status = panel.querySelector(".jp-Notebook-ExecutionIndicator")?.dataset.status;
  return /^\\[\\d+\\]:$/.test(prompts[0]) && !prompts.some((p) => p.includes("*"))
    && status === "idle";
}"""


@pytest.fixture(scope="module")
def lab(marker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The course's JupyterLab at the smoke preset, serving a copy of notebooks/ with the reference
    answers in the exercise cells: a learner who has solved them, so Run All runs to the end."""
    workdir = tmp_path_factory.mktemp("lab")
    root = workdir / "notebooks"
    shutil.copytree(notebooks_dir(), root,
                    ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"))
    for path in lesson_paths(root):
        notebook = jupytext.read(path)
        if use_solutions(notebook, SOLUTIONS):
            jupytext.write(notebook, path, fmt="py:percent")
    name, value = marker.split("=", 1)
    server = start_lab(root, workdir, {"AMP_TUTORIAL_PRESET": "smoke", name: value})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(browser: Browser, lab: LabServer) -> Iterator[Page]:
    """A fresh browser profile on the lab, logged in with the token, with a fresh workspace."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(f"{lab.url}/lab?reset&token={lab.token}")
        yield page
    finally:
        context.close()
        lab.shutdown_kernels()


def open_in_file_browser(page: Page, filename: str) -> Locator:
    """Double-click ``filename`` in the file browser; return the main-area widget that opens."""
    name = re.compile(f"^{re.escape(filename)}$")
    item = page.locator(".jp-DirListing-item").filter(
        has=page.locator(".jp-DirListing-itemText", has_text=name))
    item.dblclick()
    return current_panel(page, filename)


def current_panel(page: Page, filename: str) -> Locator:
    """The main-area widget of ``filename``'s tab, once that tab is the current one."""
    name = re.compile(f"^{re.escape(filename)}$")
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text=name)
    expect(tab).to_have_class(re.compile(r"\blm-mod-current\b"))
    return page.locator(f"#{tab.get_attribute('data-id')}")


def wait_for_kernel_connection(lab: LabServer, path: str) -> None:
    """Wait until the server has an idle kernel for ``path`` with the browser connected to it.

    The page alone cannot tell: the toolbar shows the kernel's name while the kernel is still
    pending, and the execution indicator starts out reading idle. JupyterLab's
    ``CodeCell.execute`` returns without running anything while the session has no kernel yet,
    so a Run All clicked in that window leaves every cell at ``[ ]`` and the run never finishes.
    The browser opens the kernel's websocket only once its session has the kernel, so one
    connection on the server side means Run All will reach the kernel.
    """
    deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
    seen: object = None
    while time.monotonic() < deadline:
        status, sessions = lab.api("/api/sessions")
        kernels = [s["kernel"] for s in sessions or [] if s.get("path") == path and s.get("kernel")]
        seen = kernels
        if status == 200 and any(k.get("connections", 0) >= 1 and k.get("execution_state") == "idle"
                                 for k in kernels):
            return
        time.sleep(0.25)
    pytest.fail(f"no idle kernel with a browser connection for {path} within "
                f"{UI_TIMEOUT_MS // 1000} s; the server's kernels for it: {seen}")


def run_all(page: Page, panel: Locator, lab: LabServer, path: str, kernel: str,
            n_code_cells: int) -> Locator:
    """Wait for the kernel, then Run > Run All Cells, and wait until the run is over; return the
    notebook's panel (a new one if the page had to be reloaded)."""
    for tries in (1, 2):
        # Run All before the kernel is up asks for a kernel in a dialog, or runs nothing at all.
        expect(panel.locator(".jp-KernelName")).to_have_text(kernel)
        wait_for_kernel_connection(lab, path)
        expect(panel.locator(".jp-Notebook-ExecutionIndicator")).to_have_attribute(
            "data-status", "idle")
        expect(panel.locator(".jp-CodeCell")).to_have_count(n_code_cells)
        click_run_all(page)
        if tries == 2 or run_started(panel, lab, path):
            break
        # Seen twice in CI, both times lesson 03: every cell queued at [*] while the kernel,
        # connected to the browser, stayed idle: the execute requests never reached it, and a
        # second Run All on the same page was lost as well (CI of 3dc664d, 2026-11-27). What a
        # learner does then: restart the kernel and reload the page, which connects anew (the
        # restart also numbers the cells from [1] again, whatever reached the kernel before).
        # A warning, not a print: pytest lists warnings in CI's log for passing tests too.
        warnings.warn(f"{path}: Run All reached no kernel within {RUN_START_S} s; restarting the "
                      "kernel and reloading the page", stacklevel=1)
        _, sessions = lab.api("/api/sessions")
        for session in sessions or []:
            if session.get("path") == path and session.get("kernel"):
                lab.api(f"/api/kernels/{session['kernel']['id']}/restart", "POST")
        page.reload()
        panel = current_panel(page, path)
    page.wait_for_function(RUN_FINISHED_JS, arg=panel.element_handle(), timeout=RUN_ALL_TIMEOUT_MS,
                           polling=500)
    return panel


RUN_START_S = 30  # the first cell (imports) takes about 5 s here
FIRST_PROMPT_JS = """(panel) => panel.querySelector(".jp-CodeCell .jp-InputArea-prompt")
  ?.textContent.trim() ?? "" """


def click_run_all(page: Page) -> None:
    page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()


def run_started(panel: Locator, lab: LabServer, path: str) -> bool:
    """True once the kernel shows it got the run: busy, or the first cell numbered."""
    deadline = time.monotonic() + RUN_START_S
    while time.monotonic() < deadline:
        if re.fullmatch(r"\[\d+\]:", panel.evaluate(FIRST_PROMPT_JS)):
            return True
        _, sessions = lab.api("/api/sessions")
        if any(s.get("path") == path and (s.get("kernel") or {}).get("execution_state") == "busy"
               for s in sessions or []):
            return True
        time.sleep(0.25)
    return False


def save_screenshot(page: Page, panel: Locator, name: str) -> Path:
    """The whole notebook in one tall picture: the viewport is stretched to its height."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{Path(name).stem}.png"
    scroller = panel.locator(".jp-WindowedPanel-outer")
    if scroller.count() == 1:  # else no notebook opened (a failing test): the page as it is
        extra = scroller.evaluate("(s) => s.scrollHeight - s.clientHeight")
        height = min(VIEWPORT["height"] + extra + 20, 16_000)  # Chromium's limit is 16384 px
        page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
        scroller.evaluate("(s) => s.scrollTo(0, 0)")
        try:  # the lab re-lays out on resize; the screenshot is worth having even if it lags
            page.wait_for_function("(s) => s.scrollHeight <= s.clientHeight + 1",
                                   arg=scroller.element_handle(), timeout=10_000)
        except PlaywrightTimeoutError:
            pass
    page.screenshot(path=path)
    page.set_viewport_size(VIEWPORT)
    return path


def check_autocast_basics(cells: list[Cell], info: DeviceInfo) -> None:
    """Lesson 01 shows autocast lowering the matmul to this device's AMP dtype and not the add."""
    shown = "\n".join(cell.text for cell in cells)
    for line in (f"x @ y.T -> {info.amp_dtype}, x + y -> torch.float32",
                 f"the layer's output is {info.amp_dtype}"):
        assert line in shown, f"{line!r} is not shown; the dtype lines are:\n" + "\n".join(
            shown_line for shown_line in shown.splitlines() if "torch." in shown_line)


def check_amp_training(cells: list[Cell], info: DeviceInfo) -> None:
    """Lesson 03 shows the results table: one row for the fp32 baseline and one per AMP dtype."""
    expected = [fp32_baseline(info), *(f"AMP {dtype_name(d)}" for d in info.amp_dtypes)]
    tables = [rows for cell in cells for rows in cell.tables]
    assert expected in tables, f"no results table with rows {expected}; tables shown: {tables}"


LESSONS: dict[str, Callable[[list[Cell], DeviceInfo], None]] = {
    "01_autocast_basics.py": check_autocast_basics,
    "03_amp_training.py": check_amp_training,
}


@pytest.mark.parametrize("filename", LESSONS)
def test_lesson_runs_in_the_browser(filename: str, page: Page, lab: LabServer,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    notebook = jupytext.read(lab.root / filename)
    sources = [c.source for c in notebook.cells if c.cell_type == "code"]

    panel = open_in_file_browser(page, filename)
    try:
        kind = panel.get_attribute("class")
        assert "jp-NotebookPanel" in kind.split(), (
            f"{filename} opened as {kind!r}, not as a notebook: the defaultViewers lab setting "
            "(etc/jupyter/labconfig/default_setting_overrides.json) is not in effect")
        expect(panel.locator(".jp-Cell")).to_have_count(len(notebook.cells))
        panel = run_all(page, panel, lab, filename,
                        notebook.metadata["kernelspec"]["display_name"], len(sources))
        cells = read_cells(panel, sources)
    finally:
        screenshot = save_screenshot(page, panel, filename)
        with capsys.disabled():
            print(f"\n{filename}: screenshot {screenshot}")

    failed = [f"{cell}:\n{cell.errors[0][-2000:]}" for cell in cells if cell.errors]
    assert not failed, "\n\n".join(failed)
    prompts = [cell.prompt for cell in cells]
    assert prompts == [f"[{i}]:" for i in range(1, len(cells) + 1)], "not every cell ran, in order"
    for cell in cells:
        if FIGURE_CELL.search(cell.source):
            assert cell.images >= 1, f"{cell} makes a figure, but no image is shown"
    LESSONS[filename](cells, select_device())
    # fetchNews "false" in the lab settings: no "get Jupyter news?" pop-up on first start.
    news = page.locator(".Toastify__toast").filter(has_text=re.compile("news", re.IGNORECASE))
    assert news.count() == 0, f"a news pop-up is shown: {news.all_inner_texts()}"


def test_a_failing_cell_is_reported(page: Page, lab: LabServer) -> None:
    """The error check above sees a real traceback, and Run All stops there."""
    header = (lab.root / next(iter(LESSONS))).read_text().split("# %%")[0]  # a lesson's metadata
    source = ["x = 1", 'raise ValueError("raised on purpose")', "y = 2"]
    path = lab.root / "zz_fails_on_purpose.py"
    path.write_text(header + "".join(f"# %%\n{line}\n\n" for line in source))
    notebook = jupytext.read(path)
    page.reload()  # the file browser lists the new file

    panel = open_in_file_browser(page, path.name)
    panel = run_all(page, panel, lab, path.name, notebook.metadata["kernelspec"]["display_name"],
                    len(source))
    first, failing, after = read_cells(panel, source)
    assert first.prompt == "[1]:" and not first.errors
    assert failing.errors and "ValueError: raised on purpose" in failing.errors[0]
    assert after.prompt in ("[ ]:", "[]:") and not after.text, "Run All went on past the error"


def test_lab_without_the_token_gives_no_access(browser: Browser, lab: LabServer) -> None:
    assert lab.api("/api/contents")[0] == 200  # with the token: the control
    assert lab.api("/api/contents", token=None)[0] == 403
    assert lab.api("/api/contents", token="not-the-token")[0] == 403
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.goto(f"{lab.url}/lab", timeout=UI_TIMEOUT_MS)
        expect(page).to_have_url(re.compile(r"/login\b"))
        token_field = page.get_by_role("textbox", name=re.compile("token", re.IGNORECASE))
        expect(token_field).not_to_have_count(0)
        assert page.locator(".jp-DirListing-item").count() == 0  # no file browser, no lab
    finally:
        context.close()


# --- outputs survive: the lesson is paired with an .ipynb that keeps them (course_tools.pairing) --
PROMPT_DONE_JS = """([panel, index]) => {
  const prompt = panel.querySelectorAll(".jp-CodeCell .jp-InputArea-prompt")[index];
  const status = panel.querySelector(".jp-Notebook-ExecutionIndicator")?.dataset.status;
  return /^\\[\\d+\\]:$/.test(prompt?.textContent.trim() ?? "") && status === "idle";
}"""


def menu(page: Page, top: str, item: str | re.Pattern[str]) -> None:
    page.locator(".lm-MenuBar-itemLabel").get_by_text(top, exact=True).click()
    label = page.locator(".lm-Menu-itemLabel")
    (label.get_by_text(item, exact=True) if isinstance(item, str)
     else label.filter(has_text=item)).first.click()


def test_outputs_survive_save_reload_and_reopen(page: Page, lab: LabServer) -> None:
    """Run lesson 01 down to its first figure (a table, then the figure), File > Save, reload the
    page without the kernel, reopen: the table and the figure come back from the paired .ipynb."""
    filename = "01_autocast_basics.py"
    lesson, ipynb = lab.root / filename, (lab.root / filename).with_suffix(".ipynb")
    before = lesson.read_bytes()
    ipynb.unlink(missing_ok=True)  # another test may have saved it
    notebook = jupytext.read(lesson)
    sources = [c.source for c in notebook.cells if c.cell_type == "code"]
    figure = next(i for i, s in enumerate(sources) if FIGURE_CELL.search(s))
    table = max(i for i, s in enumerate(sources[:figure]) if "pd.DataFrame" in s)

    panel = open_in_file_browser(page, filename)
    expect(panel.locator(".jp-KernelName")).to_have_text(
        notebook.metadata["kernelspec"]["display_name"])
    wait_for_kernel_connection(lab, filename)
    expect(panel.locator(".jp-Notebook-ExecutionIndicator")).to_have_attribute(
        "data-status", "idle")
    panel.locator(".jp-CodeCell .jp-InputPrompt").nth(figure).click()  # select the figure's cell
    for attempt in range(2):  # as in run_all: a run can once fail to reach the kernel
        menu(page, "Run", "Run All Above Selected Cell")
        menu(page, "Run", re.compile(r"^Run Selected Cells?$"))
        if run_started(panel, lab, filename):
            break
        warnings.warn(f"{filename}: the run reached no kernel within {RUN_START_S} s "
                      f"(try {attempt + 1})", stacklevel=1)
    page.wait_for_function(PROMPT_DONE_JS, arg=[panel.element_handle(), figure],
                           timeout=RUN_ALL_TIMEOUT_MS, polling=500)
    ran = read_cells(panel, sources)
    assert ran[figure].images >= 1 and ran[table].tables, "the run showed no figure or table"

    menu(page, "File", "Save Python File")  # the lab's own save of a .py opened as a notebook
    expect(page.locator(".lm-DockPanel-tabBar .jp-mod-dirty")).to_have_count(0)
    deadline = time.monotonic() + 30
    while not ipynb.exists() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert ipynb.exists(), "File > Save wrote no paired .ipynb"
    assert lesson.read_bytes() == before, "saving without edits changed the lesson's .py"

    lab.shutdown_kernels()  # what comes back must come from the files, not a live kernel
    page.goto(f"{lab.url}/lab?reset")  # reload, with the lesson's tab closed
    panel = open_in_file_browser(page, filename)
    expect(panel.locator(".jp-CodeCell")).to_have_count(len(sources))
    back = read_cells(panel, sources)
    assert back[table].tables == ran[table].tables and back[table].text == ran[table].text
    assert back[figure].images == ran[figure].images >= 1, "the figure did not come back"
    assert not any(c.text or c.images for c in back[figure + 1:]), "unrun cells show output"


def test_the_handouts_zip_opens_in_the_lab_with_its_outputs(page: Page, lab: LabServer,
                                                           tmp_path: Path) -> None:
    """A class without GPUs unzips `pdm run handout`'s notebooks-with-outputs.zip into their lab:
    the notebook opens as it is (no .py beside it) with the text and figure the run made."""
    import zipfile

    from course_tools.handout import ZIP_NAME, render_handout

    header = (lab.root / "01_autocast_basics.py").read_text().split("# %%")[0]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01_take_home.py").write_text(
        header + "# %% [markdown]\n# # 01 · Take home\n\n# %%\nprint('printed at home')\n\n"
        "# %%\nimport matplotlib.pyplot as plt\n\nfig, ax = plt.subplots()\nax.plot([1, 2])\n")
    render_handout(tmp_path / "out", "smoke", notebooks)
    with zipfile.ZipFile(tmp_path / "out" / ZIP_NAME) as zipped:
        zipped.extractall(lab.root)
    page.reload()  # the file browser lists the unzipped notebook
    panel = open_in_file_browser(page, "01_take_home.ipynb")
    sources = ["print('printed at home')", "import matplotlib.pyplot as plt\n\nfig, ax = "
               "plt.subplots()\nax.plot([1, 2])"]
    expect(panel.locator(".jp-CodeCell")).to_have_count(2)
    printed, figure = read_cells(panel, sources)
    assert "printed at home" in printed.text and figure.images == 1
    assert not (lab.root / "01_take_home.py").exists(), "opening it wrote a .py beside it"
