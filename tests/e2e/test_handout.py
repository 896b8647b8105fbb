"""The handout as a learner opens it: ``pdm run handout``'s pages in real Chromium, from disk.

Rendering every lesson takes minutes, so the command runs at the ``smoke`` preset on the first
lesson and every lesson with an exercise (each stub shown, its answer and checker output hidden);
the index is checked against every lesson without running them. Chromium is the one
``test_browser`` uses (``tests/conftest.py``); without it these tests skip, except under
``CI=true``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat
import pytest
import torch
from playwright.sync_api import Browser, Page

from course_tools.answers import is_exercise
from course_tools.catalogue import find_lessons, format_hours, lesson_paths, select_lessons
from course_tools.handout import LessonRun, format_seconds, index_html, main, render_handout
from tests.support import NOTEBOOKS, SOLUTIONS
from tests.support.notebook_page import FIGURE_CELL, UI_TIMEOUT_MS, Cell, read_cells

pytestmark = pytest.mark.browser

LESSON_FILES = lesson_paths(NOTEBOOKS)  # what a lesson is, as the README says
TABLE_MIMES = ("text/html", "text/markdown")


def first_heading(path: Path) -> str:
    """The lesson's title as its first Markdown cell shows it: ``NN · Title``."""
    notebook = jupytext.read(path)
    markdown = next(cell for cell in notebook.cells if cell.cell_type == "markdown")
    return markdown.source.splitlines()[0].removeprefix("# ").strip()


def handout(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``pdm run handout ARGS``, in this process (torch is imported already): exit code, stdout
    and stderr."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def open_lesson(page: Page, html_path: Path, lesson: Path) -> list[Cell]:
    """Open a rendered lesson from disk; its code cells, paired with the learner's sources."""
    page.goto(html_path.as_uri())
    notebook = jupytext.read(lesson)
    sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    return read_cells(page.locator("body"), sources)


def test_index_lists_every_lesson(page: Page, tmp_path: Path) -> None:
    """Every lesson the glob finds is on the index, with its title, its page, its track, a
    person's time and the machine's run time."""
    lessons = find_lessons(NOTEBOOKS)
    assert [lesson.path for lesson in lessons] == LESSON_FILES, "the handout skips or adds lessons"
    runs = [LessonRun(lesson, 7.25 * (i + 1)) for i, lesson in enumerate(lessons)]
    index = tmp_path / "index.html"
    index.write_text(index_html(runs, "cpu", "a test device", torch.__version__))
    page.goto(index.as_uri())

    links = page.locator("tbody a")
    assert links.count() == len(LESSON_FILES)
    for i, path in enumerate(LESSON_FILES):
        number, title = first_heading(path).split(" · ", 1)
        link = links.nth(i)
        assert link.get_attribute("href") == f"{path.stem}.html"
        assert link.inner_text() == title.replace("`", ""), f"{path.name}: title not shown"
        row = page.locator("tbody tr").nth(i).inner_text()
        assert row.startswith(number) and format_seconds(7.25 * (i + 1)) in row, row
        lesson = lessons[i]
        assert lesson.track in row and format_hours(lesson.learner_minutes) in row, row


def test_lessons_are_chosen_by_number_or_name_in_course_order() -> None:
    lessons = find_lessons(NOTEBOOKS)
    last, first = LESSON_FILES[-1], LESSON_FILES[0]
    chosen = select_lessons(lessons, [last.name, first.name[:2]])
    assert [lesson.path for lesson in chosen] == [first, last]
    assert select_lessons(lessons, [first.stem]) == lessons[:1]
    with pytest.raises(SystemExit, match=f"no lesson 'zz'; the lessons are {first.name[:2]}, "):
        select_lessons(lessons, ["zz"])


@dataclass
class Rendered:
    out: Path
    lessons: list[Path]


@pytest.fixture(scope="module")
def rendered(marker: str, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The handout at the smoke preset of the first lesson and every lesson with an exercise."""
    exercises = [p for p in LESSON_FILES if any(map(is_exercise, jupytext.read(p).cells))]
    lessons = sorted({LESSON_FILES[0], *exercises})
    out = tmp_path_factory.mktemp("handout")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(*marker.split("=", 1))  # the kernels inherit it
        runs = render_handout(out, "smoke", wanted=[p.name[:2] for p in lessons])
    assert [run.error for run in runs] == [None] * len(lessons)
    return Rendered(out, lessons)


def test_handout_pages_show_the_executed_lessons(rendered: Rendered, page: Page) -> None:
    index = rendered.out / "index.html"
    timings = json.loads((rendered.out / "timings.json").read_text())
    assert timings["preset"] == "smoke" and timings["torch"] == torch.__version__
    assert set(timings["seconds"]) == {p.stem for p in rendered.lessons}
    assert all(s > 0 for s in timings["seconds"].values()) and not timings["failed"]

    page.goto(index.as_uri())
    hrefs = page.locator("tbody a").evaluate_all("(links) => links.map((a) => a.href)")
    assert hrefs == [(rendered.out / f"{p.stem}.html").as_uri() for p in rendered.lessons]
    for path in rendered.lessons:
        row = page.locator("tbody tr").filter(has=page.locator(f'a[href="{path.stem}.html"]'))
        assert format_seconds(timings["seconds"][path.stem]) in row.inner_text()

    shown, with_figures = [], 0
    for path in rendered.lessons:
        page.goto(index.as_uri())
        page.locator(f'a[href="{path.stem}.html"]').click()  # the link opens the page
        page.wait_for_url(f"**/{path.stem}.html")
        cells = open_lesson(page, rendered.out / f"{path.stem}.html", path)
        heading = first_heading(path)
        assert page.title() == heading
        h1 = page.locator("h1").first.inner_text().strip().removesuffix("¶").strip()
        assert h1 == heading.replace("`", ""), f"{path.name}: heading {h1!r}"

        failed = [f"{cell}:\n{cell.errors[0][-2000:]}" for cell in cells if cell.errors]
        assert not failed, f"{path.name}:\n" + "\n\n".join(failed)
        outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
        assert not [text for text in outputs if "Traceback" in text], f"{path.name}: a traceback"

        figures = [cell for cell in cells if FIGURE_CELL.search(cell.source)]
        with_figures += bool(figures)
        for cell in figures:
            assert cell.images >= 1, f"{path.name}: {cell} makes a figure, but none is shown"

        executed = nbformat.read(rendered.out / f"{path.stem}.ipynb", as_version=4)
        code = [c for c in executed.cells if c.cell_type == "code"]
        for cell, ran in zip(cells, code, strict=True):
            table_outputs = sum(
                any("<table" in str(o.get("data", {}).get(m, "")) for m in TABLE_MIMES)
                or "|---" in str(o.get("data", {}).get("text/markdown", ""))
                for o in ran.outputs)
            assert len(cell.tables) >= table_outputs, f"{path.name}: {cell} shows no table"
        if "pd.DataFrame(" in path.read_text():
            assert any(cell.tables for cell in cells), f"{path.name} shows no DataFrame table"
        check_exercises(page, path, cells)
        emptied = page.locator("details").evaluate_all(
            "(all) => all.filter((d) => d.children.length < 2).length")
        assert emptied == 0, f"{path.name}: {emptied} folded hints show their text outside"
        shown.append("\n".join(cell.text for cell in cells))
    assert any("'smoke'" in text for text in shown), "no lesson says it ran at the smoke preset"
    assert with_figures, "no rendered lesson makes a figure: the image check checked nothing"


def check_exercises(page: Page, path: Path, cells: list[Cell]) -> None:
    """An exercise cell shows the learner's stub, not the answer, and no output; nor does its
    checker (the next code cell), whose output would give the answer away."""
    notebook = jupytext.read(path)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    inputs = page.locator(".jp-CodeCell .jp-InputArea-editor").all_inner_texts()
    for i, cell in enumerate(code):
        if not is_exercise(cell):
            continue
        assert inputs[i].split() == cell.source.split(), f"{path.name}: {cells[i]} is not the stub"
        answer = (SOLUTIONS / cell.metadata["solution"]).read_text()
        assert answer.split() != cell.source.split()
        assert not cells[i].text, f"{path.name}: {cells[i]} shows an output"
        assert not cells[i + 1].text, f"{path.name}: the checker {cells[i + 1]} shows its output"
        note = page.locator(".jp-MarkdownCell").filter(has_text="reference answer")
        assert note.filter(has_text=cell.metadata["solution"]).count() == 1


def test_a_failing_lesson_stops_the_handout(marker: str, page: Page, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A lesson that raises fails the command, which names the lesson and the cell; with
    --keep-going its page shows the traceback, and the page check above sees it."""
    header = LESSON_FILES[0].read_text(encoding="utf-8").split("# %%")[0]  # a lesson's metadata
    source = ["x = 1", 'raise ValueError("raised on purpose")', "y = 2"]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    lesson = notebooks / "01_fails_on_purpose.py"
    lesson.write_text(header + "# %% [markdown]\n# # 01 · Fails on purpose\n\n"
                      + "".join(f"# %%\n{line}\n\n" for line in source))
    monkeypatch.setenv(*marker.split("=", 1))

    code, _, err = handout(capsys, "--preset", "smoke", "--notebooks", str(notebooks),
                           "--out", str(tmp_path / "stopped"))
    assert code == 1
    assert "01_fails_on_purpose.py failed in code cell 2 of 3 (starting 'raise ValueError" in err
    assert "ValueError: raised on purpose" in err
    assert not (tmp_path / "stopped" / "index.html").exists()

    code, out, err = handout(capsys, "--preset", "smoke", "--notebooks", str(notebooks),
                             "--out", str(tmp_path / "kept"), "--keep-going")
    index = tmp_path / "kept" / "index.html"
    assert code == 1 and "failed in code cell 2 of 3" in err
    assert index.as_uri() in out, "the command does not say where the index is"
    page.goto(index.as_uri())
    assert "failed" in page.locator("tbody tr").inner_text()
    first, failing, after = open_lesson(page, tmp_path / "kept" / f"{lesson.stem}.html", lesson)
    assert not first.errors
    assert failing.errors and "ValueError: raised on purpose" in failing.errors[0]
    assert not after.text, "the run went on past the error"
