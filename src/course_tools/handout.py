"""``pdm run handout``: the course executed at one preset and rendered to static HTML pages.

Each lesson (``notebooks/NN_*.py``) is read with jupytext, executed cell by cell in a fresh
``python3`` kernel (nbclient) whose working directory is the lessons' folder and whose environment
sets ``AMP_TUTORIAL_PRESET``, and exported with nbconvert's ``lab`` HTML template. nbconvert and
nbclient are the Jupyter project's own maintained renderer and executor, and already come with
JupyterLab (through jupyter-server), so the handout adds no dependency and needs neither Node.js
(Jupyter Book 2 / mystmd does) nor a second notebook format. The pages are self-contained: the
figures are embedded as PNG data and the page CSS is inlined, so a learner opens them from disk
with any browser. ``index.html`` lists every lesson with its title and how long it ran;
``timings.json`` gives the same run times with the preset, device and torch version. Each
executed lesson is also written as ``NN_name.ipynb``, and all of them zipped into
``notebooks-with-outputs.zip``: a class without a GPU opens a GPU run's outputs in JupyterLab.

Exercise cells (``course_tools.answers``) are run with their reference answer so the rest of
the lesson has something to show, and rendered as the learner gets them: the stub with its TODO,
without output. The code cell right after an exercise cell checks the answer; its output would
give the answer away (a quiz's checker explains every right answer), so it is left out, and a note
under the exercise cell says so.

On a GPU (CUDA, ROCm or XPU) each lesson's kernel also records the allocator's
``max_memory_allocated`` over the whole lesson, also across the resets the lesson makes before each
run it measures (``course_tools.live_memory.AllocatorPeak``, in a cell of the handout's own before
and after the lesson's, not kept in the page), into ``timings.json`` as ``max_memory_allocated``:
bytes per device used (``{"cuda:0": ...}``), null on a CPU, which has no such statistics. The
instructor's dry run at ``paper`` the day before thus gives each lesson's real peak to size the
class with (``docs/workshop.md``). This GPU path has not run yet: no GPU was available
(``docs/gpu-register.md``).

Progress bars (``tqdm.auto``) are live widgets; a static page has no widget runtime, so their
outputs are dropped. A lesson that raises stops the run with the lesson and cell named
(``--keep-going`` renders the failed page with its traceback, goes on, and still exits 1).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import re
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter
from nbformat import NotebookNode
from tqdm.auto import tqdm

from amp_tutorial import class_sync
from amp_tutorial.exercises.solutions import FOLDER as SOLUTIONS
from amp_tutorial.presets import PRESET_ENV, VALID_NAMES, get_preset
from amp_tutorial.progress import WORKSPACE_ENV
from course_tools.answers import is_exercise, use_solutions
from course_tools.catalogue import (
    LESSON_GLOB,
    Lesson,
    add_lesson_arguments,
    find_lessons,
    format_hours,
    notebooks_dir,
    select_lessons,
    track_minutes,
)
from course_tools.live_memory import read_result

DEFAULT_PRESET = "auto"
DEFAULT_OUT = Path("artifacts") / "handout"
CELL_TIMEOUT_S = 600  # per cell, as the test run's --nbval-cell-timeout
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # the colours of IPython's tracebacks
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"  # figures as PNG outputs
# nbconvert's lab page, less the scripts it loads from a CDN: require.js (for widgets, dropped
# here), MathJax (the lessons' Markdown has no LaTeX math) and mermaid (no diagrams). The page then
# needs no network at all.
PAGE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
EXERCISE_NOTE = (
    "> **Handout:** this page was run with the reference answer "
    "(`amp_tutorial/exercises/solutions/{solution}`) in place of the cell above, so the cells "
    "below show what a correct answer gives. The checker cell's output is left out: it would "
    "give the answer away.")


@dataclass
class LessonRun:
    """What rendering one lesson gave: its run time, the error that stopped it, if any, and on a
    GPU the allocator's peak over the whole lesson (``max_memory_allocated``, bytes per device)."""

    lesson: Lesson
    seconds: float
    error: str | None = None
    max_memory_allocated: dict[str, int] | None = None


class LessonFailedError(RuntimeError):
    """A lesson raised while it ran; the message names the lesson and the cell."""


@dataclass
class CellError:
    """A code cell that raised: its index in ``notebook.cells``, what it raised, the whole text."""

    index: int
    what: str  # "AssertionError: ..." or "CellTimeoutError: ..."
    message: str  # with the traceback, colours removed


@dataclass
class KernelRun:
    """What running a notebook's code cells in a fresh kernel gave."""

    seconds: float  # kernel start and shutdown included
    errors: list[CellError]
    epilogue: str | None  # what the epilogue cell printed; None without one or a live kernel


@contextmanager
def kernel_env(preset: str) -> Iterator[dict[str, str]]:
    """This process's environment with the preset set, matplotlib's inline backend and a
    workspace of the run's own, removed afterwards: the reference answers a run checks are
    recorded there as passed attempts, never in a learner's progress (``amp_tutorial.progress``),
    and never sent to a class hub's progress service (its address and token are left out)."""
    with tempfile.TemporaryDirectory(prefix="amp-course-run-") as workspace:
        env = {**os.environ, PRESET_ENV: preset, "MPLBACKEND": INLINE_BACKEND,
               WORKSPACE_ENV: workspace}
        for variable in (class_sync.URL_VARIABLE, class_sync.TOKEN_VARIABLE):
            env.pop(variable, None)
        yield env


def describe_cell(notebook: NotebookNode, index: int) -> str:
    code = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    first_line = next(iter(notebook.cells[index].source.splitlines()), "")
    return f"code cell {code.index(index) + 1} of {len(code)} (starting {first_line!r})"


def read_with_answers(lesson: Lesson) -> tuple[NotebookNode, dict[int, str]]:
    """The lesson as a notebook with the reference answers in its exercise cells, and the
    learner's sources of those cells (``course_tools.answers``)."""
    notebook = jupytext.read(lesson.path)
    return notebook, use_solutions(notebook, SOLUTIONS)


# Run after an interrupted cell: drops the traceback IPython keeps (its frames would keep the
# interrupted cell's tensors alive) and says that the kernel has reached it.
SETTLE = ("import gc as _g, sys as _s\n_s.last_type = _s.last_value = _s.last_traceback = None\n"
          "_ip = get_ipython()\n_ip.last_execution_result = None\n_ip.InteractiveTB.tb = None\n"
          "del _ip\n_g.collect()\nprint('settled')")


# SETTLE is the course's cell, not the lesson's: the lesson's short --interrupt-after is no limit
# for it. The kernel answers it only once the interrupted cell has stopped and its traceback is
# printed, which a loaded machine (or a cell cleaning up after the interrupt) can make slow.
SETTLE_TIMEOUT_S = 60


def _settle_after_interrupt(client: NotebookClient, index: int, tries: int = 600) -> None:
    """Wait until the interrupted cell has stopped: the kernel aborts requests that reach it
    before the interrupt lands (a long kernel call finishes first), so send SETTLE until it runs;
    one that times out too (the interrupted cell still stopping) is sent again."""
    limit, client.timeout = client.timeout, max(client.timeout or 0, SETTLE_TIMEOUT_S)
    try:
        for _ in range(tries):
            cell = nbformat.v4.new_code_cell(SETTLE)
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as exc:
                if exc.ename != "CellTimeoutError":
                    raise
                continue  # timed out and interrupted in turn: send it again
            if any("settled" in o.get("text", "") for o in cell.outputs):
                return
            time.sleep(1)
    finally:
        client.timeout = limit


def run_notebook(notebook: NotebookNode, folder: Path, env: dict[str, str], timeout: int,
                 desc: str, stop_at_error: bool = True, prologue: str = "",
                 epilogue: str = "", interrupt_on_timeout: bool = False) -> KernelRun:
    """Run the notebook's code cells in order in a fresh ``python3`` kernel started in ``folder``.

    ``stop_at_error``: stop at the first cell that raises; otherwise run every cell and collect
    each error. A ``prologue`` runs before the first cell and an ``epilogue`` after the last (also
    after an error), as cells of their own that the notebook does not keep: the course's tools
    use them to measure the lesson. They must not raise. ``interrupt_on_timeout``: a cell that
    runs past ``timeout`` is interrupted (a ``KeyboardInterrupt`` in the kernel) and counts as
    raised, and the kernel goes on with the next cell.
    """
    cells = notebook.cells
    before = [nbformat.v4.new_code_cell(prologue)] if prologue else []
    after = [nbformat.v4.new_code_cell(epilogue)] if epilogue else []
    notebook.cells = [*before, *cells, *after]
    interrupted = {"ename": "CellTimeoutError", "traceback": [],
                   "evalue": f"interrupted after {timeout} s"}
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}},
                            store_widget_state=False, interrupt_on_timeout=interrupt_on_timeout,
                            error_on_timeout=interrupted if interrupt_on_timeout else None)
    errors: list[CellError] = []
    printed = None
    start = time.perf_counter()
    try:
        with client.setup_kernel(env=env):
            # the course's own cells are not the lesson's: `timeout` is no limit for them (a
            # loaded machine can take longer than a short --interrupt-after to import torch)
            client.timeout = None
            for cell in before:
                client.execute_cell(cell, 0)
            client.timeout = timeout
            alive = True
            code = [i for i, cell in enumerate(cells) if cell.cell_type == "code"]
            for index in tqdm(code, desc=desc, unit="cell", leave=False):
                cell = cells[index]
                try:
                    client.execute_cell(cell, index + len(before))
                except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
                    what = f"{exc.ename}: {exc.evalue}" if isinstance(exc, CellExecutionError) \
                        else f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                    errors.append(CellError(index, what, ANSI_ESCAPE.sub("", str(exc))))
                    alive = not isinstance(exc, DeadKernelError)
                    if alive and interrupt_on_timeout and isinstance(exc, CellExecutionError) \
                            and exc.ename == "CellTimeoutError":
                        _settle_after_interrupt(client, index + len(before))
                    if stop_at_error or not alive:
                        break
            client.timeout = None
            for cell in after if alive else []:
                client.execute_cell(cell, len(notebook.cells) - 1)
                printed = "".join(o.get("text", "") for o in cell.outputs
                                  if o.output_type == "stream")
    finally:
        notebook.cells = cells
    return KernelRun(round(time.perf_counter() - start, 2), errors, printed)


# Run in the lesson's kernel on a GPU: the allocator's peak over the whole lesson
# (course_tools.live_memory.AllocatorPeak), read back from the epilogue's output.
ALLOCATOR_PROLOGUE = ("from course_tools.live_memory import AllocatorPeak as _CourseAllocatorPeak\n"
                      "_course_allocator_peak = _CourseAllocatorPeak().install()")
ALLOCATOR_EPILOGUE = ("from course_tools.live_memory import print_result as _course_print\n"
                      "_course_print(_course_allocator_peak.read())")


def execute_lesson(lesson: Lesson, preset: str, timeout: int = CELL_TIMEOUT_S,
                   keep_going: bool = False,
                   allocator_peak: bool = False) -> tuple[NotebookNode, LessonRun]:
    """Run the lesson top to bottom in a fresh kernel; return the executed notebook and its time.

    Raises LessonFailedError at the first cell that raises, unless ``keep_going``: then the run
    stops there too, and the returned notebook shows the traceback. ``allocator_peak`` (on a GPU)
    also reads the allocator's peak over the whole lesson, in the kernel.
    """
    notebook, learner = read_with_answers(lesson)
    with kernel_env(preset) as env:
        run = run_notebook(notebook, lesson.path.parent, env, timeout, lesson.name,
                           prologue=ALLOCATOR_PROLOGUE if allocator_peak else "",
                           epilogue=ALLOCATOR_EPILOGUE if allocator_peak else "")
    error = None
    if run.errors:
        first = run.errors[0]
        error = f"{lesson.path.name} failed in {describe_cell(notebook, first.index)}: {first.what}"
        if not keep_going:
            raise LessonFailedError(f"{error}\n\n{first.message}")
    show_learner_cells(notebook, learner)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if WIDGET_MIME not in o.get("data", {})]
    notebook.metadata.pop("widgets", None)
    notebook.metadata["title"] = lesson.heading
    peak = read_result(run.epilogue or "") if allocator_peak else None
    return notebook, LessonRun(lesson, run.seconds, error, peak)


def show_learner_cells(notebook: NotebookNode, learner: dict[int, str]) -> None:
    """Put the learner's stub back in each exercise cell; hide the output of its checker cell."""
    for index in sorted(learner, reverse=True):  # inserting notes shifts the later cells
        cell = notebook.cells[index]
        solution = cell.metadata.get("solution")
        cell.source, cell.outputs, cell.execution_count = learner[index], [], None
        checker = next((i for i in range(index + 1, len(notebook.cells))
                        if notebook.cells[i].cell_type == "code"
                        and not is_exercise(notebook.cells[i])), None)
        outputs = notebook.cells[checker].outputs if checker is not None else []
        if not any(output.output_type == "error" for output in outputs):  # keep a failure shown
            outputs.clear()
        notebook.cells.insert(index + 1, nbformat.v4.new_markdown_cell(
            EXERCISE_NOTE.format(solution=solution)))


def add_navigation(notebook: NotebookNode, lessons: Sequence[Lesson], lesson: Lesson) -> None:
    """A first cell linking back to the index and to the previous and next lesson."""
    at = lessons.index(lesson)
    links = ["[All lessons](index.html)"]
    if at > 0:
        links.append(f"[← {lessons[at - 1].heading}]({lessons[at - 1].page})")
    if at + 1 < len(lessons):
        links.append(f"[{lessons[at + 1].heading} →]({lessons[at + 1].page})")
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell(" · ".join(links)))


def render_page(notebook: NotebookNode) -> str:
    """The notebook as one self-contained HTML page (JupyterLab's look, images embedded).

    Output figures are always embedded (PNG data). Images that Markdown cells link to are
    embedded only where a cell has one: nbconvert reparses such HTML blocks, which closes the
    hints' ``<details>`` before their text, so they would show unfolded.
    """
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    exporter = HTMLExporter(template_name="lab", template_file="handout.html.j2",
                            extra_loaders=[jinja2.DictLoader({"handout.html.j2": PAGE_TEMPLATE})],
                            embed_images=any("![" in text or "<img" in text for text in markdown))
    body, _ = exporter.from_notebook_node(notebook)
    return body


def _html_text(text: str) -> str:
    """Escaped text with Markdown's `code` spans as <code>, as in the lessons' titles."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def format_seconds(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{seconds:.1f} s"


def index_html(runs: Sequence[LessonRun], preset: str, device: str, torch_version: str) -> str:
    """The handout's front page: every lesson linked with its title, its track, a person's time
    for it and the machine's run time."""
    rows = []
    for run in runs:
        status = "" if run.error is None else f'<br><strong class="failed">failed: ' \
                                               f"{html.escape(run.error)}</strong>"
        rows.append(f'<tr><td>{html.escape(run.lesson.number)}</td>'
                    f'<td><a href="{html.escape(run.lesson.page)}">'
                    f"{_html_text(run.lesson.title)}</a>{status}</td>"
                    f"<td>{html.escape(run.lesson.track)}</td>"
                    f'<td class="time">{format_hours(run.lesson.learner_minutes or 0)}</td>'
                    f'<td class="time">{format_seconds(run.seconds)}</td></tr>')
    total = format_seconds(sum(run.seconds for run in runs))
    tracks = track_minutes([run.lesson for run in runs])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Mixed precision in PyTorch: the course, executed</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ text-align: left; padding: 0.4rem 0.6rem; border-bottom: 1px solid #ddd; }}
td.time {{ white-space: nowrap; text-align: right; }}
.failed {{ color: #b00; }}
</style>
</head>
<body>
<h1>Mixed precision in PyTorch: the course, executed</h1>
<p>Every lesson below ran top to bottom at the <code>{html.escape(preset)}</code> preset on
{html.escape(device)} with torch {html.escape(torch_version)}. Run time is each lesson's wall
time, kernel start included; {len(runs)} lessons, {total} in all. "Your time" is a person's:
reading, running and the graded exercises; the core track ({format_hours(tracks["core"])}) is a
workshop day, the advanced track ({format_hours(tracks["advanced"])}) comes after it.</p>
<table>
<thead><tr><th>#</th><th>lesson</th><th>track</th><th>your time</th>
<th>run time (machine)</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
<p>Made with <code>pdm run handout --preset {html.escape(preset)}</code> on
{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.</p>
</body>
</html>
"""


def device_and_torch() -> tuple[str, str, bool]:
    """The device the lessons' kernels pick (same environment, same rule), torch's version, and
    whether that device's allocator keeps peak statistics (CUDA/ROCm, XPU)."""
    import torch

    from amp_tutorial.device import select_device

    info = select_device()
    return str(info), torch.__version__, info.type in ("cuda", "xpu")


def render_handout(out: Path, preset: str = DEFAULT_PRESET, notebooks: Path | None = None,
                   wanted: Sequence[str] = (), keep_going: bool = False,
                   timeout: int = CELL_TIMEOUT_S) -> list[LessonRun]:
    """Execute and render the lessons into ``out``: one page and one executed ``.ipynb`` each,
    index.html, timings.json and the ``.ipynb`` files zipped."""
    notebooks = notebooks or notebooks_dir()
    lessons = find_lessons(notebooks)
    if not lessons:
        raise SystemExit(f"error: no lessons ({LESSON_GLOB}) in {notebooks}")
    chosen = select_lessons(lessons, wanted) if wanted else lessons
    out.mkdir(parents=True, exist_ok=True)
    preset = get_preset(preset).name  # `auto` as this machine resolves it, for the headers' minutes
    device, torch_version, on_gpu = device_and_torch()
    runs = []
    for lesson in tqdm(chosen, desc=f"handout ({preset})", unit="lesson"):
        notebook, run = execute_lesson(lesson, preset, timeout, keep_going, allocator_peak=on_gpu)
        nbformat.write(notebook, out / f"{lesson.name}.ipynb")  # for Jupyter users
        add_navigation(notebook, chosen, lesson)
        (out / lesson.page).write_text(render_page(notebook), encoding="utf-8")
        runs.append(run)
    (out / "index.html").write_text(index_html(runs, preset, device, torch_version),
                                    encoding="utf-8")
    timings = {
        "preset": preset, "device": device, "torch": torch_version,
        "python": platform.python_version(), "machine": platform.machine(),
        "seconds": {run.lesson.name: run.seconds for run in runs},
        "failed": {run.lesson.name: run.error for run in runs if run.error},
        # bytes per device ("cuda:0"), the allocator's peak over the whole lesson; null on a CPU
        "max_memory_allocated": {run.lesson.name: run.max_memory_allocated for run in runs},
    }
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n", encoding="utf-8")
    write_notebook_zip(out, [run.lesson.name for run in runs])
    return runs


ZIP_NAME = "notebooks-with-outputs.zip"


def write_notebook_zip(out: Path, names: Sequence[str]) -> Path:
    """Zip the executed ``out/NAME.ipynb`` files, in course order, into ``out/ZIP_NAME``."""
    archive = out / ZIP_NAME
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        for name in names:
            zipped.write(out / f"{name}.ipynb", arcname=f"{name}.ipynb")
    return archive


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pdm run handout",
        description="Run every lesson at one preset and render the course to static HTML pages.")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=VALID_NAMES,
                        help=f"problem sizes the lessons run at (default {DEFAULT_PRESET})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output folder (default {DEFAULT_OUT})")
    add_lesson_arguments(parser)
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S,
                        help=f"seconds one cell may run (default {CELL_TIMEOUT_S})")
    parser.add_argument("--keep-going", action="store_true",
                        help="render a failing lesson with its traceback and go on (exit 1)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        runs = render_handout(args.out, args.preset, args.notebooks, args.lessons,
                              args.keep_going, args.timeout)
    except LessonFailedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    index = (args.out / "index.html").resolve()
    print(f"{len(runs)} lessons at the {get_preset(args.preset).name!r} preset in "
          f"{format_seconds(time.perf_counter() - start)}; open {index.as_uri()}; the notebooks "
          f"with their outputs: {(args.out / ZIP_NAME).resolve()}")
    failed = [run.error for run in runs if run.error]
    for error in failed:
        print(f"error: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
