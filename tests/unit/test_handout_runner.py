"""``pdm run handout`` without a browser: what ``timings.json`` records on a CPU. The pages
themselves are checked in a browser by ``tests/e2e/test_handout.py``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import nbformat

from amp_tutorial.class_sync import URL_VARIABLE
from amp_tutorial.progress import FOLDER, WORKSPACE_ENV
from course_tools.handout import ZIP_NAME, render_handout
from tests.support import NOTEBOOKS


def test_a_cpu_records_no_allocator_peak(tmp_path: Path) -> None:
    """On a GPU each lesson's ``max_memory_allocated`` goes into timings.json; a CPU has no
    allocator statistics, so the entry is null, not a number, and the lesson's cells are the
    lesson's own."""
    header = (NOTEBOOKS / "01_autocast_basics.py").read_text(encoding="utf-8").split("# %%")[0]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cells = "# %%\nimport torch\n\n# %%\nx = torch.ones(3)\n"
    (notebooks / "01_tiny.py").write_text(header + "# %% [markdown]\n# # 01 · Tiny\n\n" + cells,
                                          encoding="utf-8")
    runs = render_handout(tmp_path / "out", "smoke", notebooks)
    timings = json.loads((tmp_path / "out" / "timings.json").read_text())
    assert timings["device"].startswith("cpu")
    assert timings["max_memory_allocated"] == {"01_tiny": None}
    assert runs[0].error is None and runs[0].max_memory_allocated is None
    executed = nbformat.read(tmp_path / "out" / "01_tiny.ipynb", as_version=4)
    assert [cell.source for cell in executed.cells if cell.cell_type == "code"] == [
        "import torch", "x = torch.ones(3)"]


def test_the_zip_holds_each_lessons_executed_notebook_with_its_outputs(tmp_path: Path) -> None:
    """`pdm run handout` zips one .ipynb per lesson, in course order, with the outputs it ran."""
    header = (NOTEBOOKS / "01_autocast_basics.py").read_text(encoding="utf-8").split("# %%")[0]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for number in ("01", "02"):
        (notebooks / f"{number}_tiny.py").write_text(
            f"{header}# %% [markdown]\n# # {number} · Tiny\n\n# %%\nprint('ran {number}')\n",
            encoding="utf-8")
    render_handout(tmp_path / "out", "smoke", notebooks)
    with zipfile.ZipFile(tmp_path / "out" / ZIP_NAME) as zipped:
        assert zipped.namelist() == ["01_tiny.ipynb", "02_tiny.ipynb"]
        for name in zipped.namelist():
            notebook = nbformat.reads(zipped.read(name).decode(), as_version=4)
            nbformat.validate(notebook)
            code = [cell for cell in notebook.cells if cell.cell_type == "code"]
            assert [o.get("text") for o in code[-1].outputs] == [f"ran {name[:2]}\n"]


def test_the_handout_records_no_attempt_in_the_learner_s_workspace(tmp_path: Path,
                                                                     monkeypatch) -> None:
    """The handout runs the reference answers, which the checkers record as passed attempts: in
    a workspace of the run's own, never the learner's (their progress table would show exercises
    nobody solved) nor the lessons' folder, and never sent to a class hub."""
    learner = tmp_path / "learner"
    monkeypatch.setenv(WORKSPACE_ENV, str(learner))
    monkeypatch.setenv(URL_VARIABLE, "http://127.0.0.1:9/never")
    header = (NOTEBOOKS / "01_autocast_basics.py").read_text(encoding="utf-8").split("# %%")[0]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cells = ("# %%\nimport os\nfrom amp_tutorial.progress import attempts_path, record_attempt\n"
             "\n# %%\nprint(record_attempt('01', 'tiny', True, [], 'right') is not None,"
             " attempts_path().exists(), os.environ.get('AMP_PROGRESS_URL'))\n")
    (notebooks / "01_tiny.py").write_text(header + "# %% [markdown]\n# # 01 · Tiny\n\n" + cells,
                                          encoding="utf-8")
    render_handout(tmp_path / "out", "smoke", notebooks)
    executed = nbformat.read(tmp_path / "out" / "01_tiny.ipynb", as_version=4)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert [o.get("text") for o in code[-1].outputs] == ["True True None\n"]  # it was recorded
    assert not (learner / FOLDER).exists() and not (notebooks / FOLDER).exists()
