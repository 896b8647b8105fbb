"""The lessons as files: numbered, py:percent with the python3 kernel, and stable under a save."""

import jupytext
import pytest

from conftest import is_notebook
from course_tools.catalogue import lesson_paths
from tests.support import NOTEBOOKS

LESSONS = lesson_paths(NOTEBOOKS)


def test_lessons_are_numbered_in_order():
    numbers = [int(p.name[:2]) for p in LESSONS]
    assert numbers == list(range(1, len(LESSONS) + 1))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_saving_in_jupyterlab_rewrites_nothing(path):
    """JupyterLab saves through jupytext; a save without edits must leave the file as it was."""
    notebook = jupytext.read(path)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert jupytext.writes(notebook, fmt="py:percent") == path.read_text()


TEMPLATE = NOTEBOOKS / "_template.py"


def header(path):
    """The jupytext header without the lesson's own ``amp_tutorial`` block (test_catalogue)."""
    lines, skipping = [], False
    for line in path.read_text().split("# %%")[0].splitlines():
        if line == "#   amp_tutorial:":
            skipping = True
            continue
        if skipping and line.startswith("#     "):
            continue
        skipping = False
        lines.append(line)
    return "\n".join(lines)


def test_the_template_has_every_lesson_header_and_is_not_collected():
    """CONTRIBUTING.md says: copy the template. Its header must be the lessons' own."""
    assert TEMPLATE not in LESSONS and not is_notebook(TEMPLATE)
    assert {header(path) for path in LESSONS} == {header(TEMPLATE)}
    assert jupytext.writes(jupytext.read(TEMPLATE), fmt="py:percent") == TEMPLATE.read_text()


MAX_LESSON_LINES = 450  # CONTRIBUTING: one question per lesson, readable in one sitting
MAX_CELL_LINES = 25  # CONTRIBUTING: a code cell fits on a screen


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lessons_keep_to_the_size_rules(path):
    """A lesson that grows past these is split at its headings (CONTRIBUTING.md). The header's
    ``amp_tutorial`` block is not counted: the tools write measured figures there (minutes per
    preset, memory), which makes no lesson longer to read."""
    metadata = len(path.read_text().split("# %%")[0].splitlines()) - len(header(path).splitlines())
    assert len(path.read_text().splitlines()) - metadata <= MAX_LESSON_LINES
    for index, cell in enumerate(jupytext.read(path).cells):
        if cell.cell_type == "code":
            lines = len(cell.source.strip("\n").splitlines())
            assert lines <= MAX_CELL_LINES, f"{path.name}: cell {index} has {lines} lines"


@pytest.mark.parametrize("path", [*lesson_paths(), NOTEBOOKS / "_template.py"],
                         ids=lambda p: p.stem)
def test_no_cell_shows_a_stray_generator(path):
    """``torch.manual_seed`` returns the generator: as a cell's last line Jupyter shows
    ``<torch._C.Generator at 0x...>`` under it (seven lessons did, seen in the H100 run's logs);
    ``save_checkpoint`` returns its path, shown as ``PosixPath('/tmp/...')`` (lesson 05 did)."""
    import ast

    for index, cell in enumerate(jupytext.read(path).cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith(("%", "!")):
            continue
        body = ast.parse(cell.source).body
        last = body[-1] if body else None
        shown = isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
        assert not (shown and ast.unparse(last.value.func).endswith(
            ("manual_seed", "save_checkpoint"))), (
            f"{path.name}: cell {index} ends with {ast.unparse(last)}, whose value Jupyter "
            "shows under the cell: assign it, or end the cell with the prints")
