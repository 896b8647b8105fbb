"""``python -m course_tools.memory`` on a made-up lesson with known tensor sizes, run for real in a
kernel: the peak and what is left, the step cap in the kernel, cells that raise reported and the
run going on past them, and ``--record`` writing the header that the README's table shows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jupytext
import pytest

from course_tools.catalogue import (
    find_lessons,
    format_memory,
    read_lesson,
    record_memory,
    run_time_table,
)
from course_tools.memory import ASSERT_STEPS, StepCaps, main, mib
from tests.support import NOTEBOOKS

MIB = 2**20
CELLS = [
    # the step cap reached the lesson; the sizes are paper's
    "import torch\nfrom amp_tutorial.presets import get_preset\npreset = get_preset()\n"
    "assert (preset.name, preset.grid) == ('paper', 512)\n"
    "assert (preset.steps, preset.warmup, preset.inference_steps) == (3, 1, 2), preset\n"
    "assert (preset.transformer.steps, preset.transformer.warmup) == (2, 1), preset\n"
    # the fp16 demonstrations get a GPU's width on this CPU, 16 without the tool's variable
    "from amp_tutorial.presets import fp16_width\nassert fp16_width(preset, 'cpu') == 256",
    "a = torch.empty(8 * 2**20, dtype=torch.uint8)\nb = torch.empty(4 * 2**20, dtype=torch.uint8)",
    "del a\nmade_here = 1\nraise AssertionError('too few steps to learn')",
    "c = torch.empty(2 * 2**20, dtype=torch.uint8)",
    "print(made_after_the_error)",  # a name a failed cell would have made
]


def write_lesson(folder: Path, number: str, cells: list[str]) -> Path:
    """A lesson file with a real lesson's header and these code cells."""
    folder.mkdir(parents=True, exist_ok=True)
    header = (NOTEBOOKS / "01_autocast_basics.py").read_text(encoding="utf-8").split("# %%")[0]
    path = folder / f"{number}_made_up.py"
    path.write_text(header + f"# %% [markdown]\n# # {number} · Made up\n\n"
                    + "".join(f"# %%\n{cell}\n\n" for cell in cells), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One ``python -m course_tools.memory --record --json`` run over the made-up lesson."""
    root = tmp_path_factory.mktemp("memory")
    lesson = write_lesson(root / "notebooks", "01", CELLS)
    report = root / "report.json"
    assert main(["--notebooks", str(lesson.parent), "--record", "--json", str(report)]) == 0
    return {"report": json.loads(report.read_text()), "lesson": lesson}


def test_the_peak_is_the_most_bytes_alive_at_once(measured: dict) -> None:
    (row,) = measured["report"]["lessons"]
    assert row["peak_bytes"] == 12 * MIB  # a and b together; c came after a was freed
    assert row["live_bytes"] == 6 * MIB  # b and c
    assert row["max_rss_bytes"] > row["peak_bytes"]


def test_every_cell_runs_and_each_that_raised_is_named(measured: dict) -> None:
    (row,) = measured["report"]["lessons"]
    assert row["raised"] == [  # not the first cell: the cap was in place
        {"cell": "code cell 3 of 5 (starting 'del a')",
         "error": "AssertionError: too few steps to learn"},
        {"cell": "code cell 5 of 5 (starting 'print(made_after_the_error)')",
         "error": "NameError: name 'made_after_the_error' is not defined"}]
    assert measured["report"]["caps"] == {**StepCaps().__dict__}


def test_record_writes_the_header_and_the_table_shows_it(measured: dict) -> None:
    lesson = read_lesson(measured["lesson"])
    source = read_lesson(NOTEBOOKS / "01_autocast_basics.py")
    assert lesson.memory == {**source.memory, "paper": 12}  # other presets' figures kept
    assert lesson.minutes == source.minutes
    assert f"| {format_memory(lesson)} |" in run_time_table([lesson])
    assert "| 12 MiB |" in run_time_table([lesson])
    text = measured["lesson"].read_text()
    assert jupytext.writes(jupytext.read(measured["lesson"]), fmt="py:percent") == text
    assert text.split("# ---\n", 2)[2].startswith("\n# %% [markdown]\n# # 01 · Made up")


def test_a_process_figure_is_shown_next_to_the_kernels(tmp_path: Path) -> None:
    path = tmp_path / "11_amp_ddp.py"
    shutil.copy(NOTEBOOKS / path.name, path)
    record_memory(path, "paper", 40)
    record_memory(path, "paper", 180, key="process_memory")
    lesson, source = read_lesson(path), read_lesson(NOTEBOOKS / path.name)
    assert lesson.memory == {**source.memory, "paper": 40}
    assert lesson.process_memory == {**source.process_memory, "paper": 180}
    assert "| 40 MiB + 180 MiB per DDP process |" in run_time_table([lesson])
    with pytest.raises(ValueError, match="no memory figure 'minutes'"):
        record_memory(path, "paper", 1, key="minutes")


def test_mib_rounds_up() -> None:
    assert (mib(MIB), mib(MIB + 1), mib(None)) == (1, 2, None)


def test_every_lesson_given_more_steps_exists() -> None:
    """ASSERT_STEPS names lessons by file stem: a renamed lesson must be renamed there too."""
    assert set(ASSERT_STEPS) <= {lesson.name for lesson in find_lessons(NOTEBOOKS)}
    assert all(steps > StepCaps.steps for steps in ASSERT_STEPS.values())


def measure_interrupting(tmp_path: Path, cells: list[str], seconds: int) -> dict:
    """The memory tool's report row for a made-up lesson of ``cells``, run with
    ``--interrupt-after seconds``."""
    lesson = write_lesson(tmp_path / "notebooks", "01", cells)
    report = tmp_path / "report.json"
    assert main(["--notebooks", str(lesson.parent), "--interrupt-after", str(seconds),
                 "--json", str(report)]) == 0
    (row,) = json.loads(report.read_text())["lessons"]
    return row


def test_interrupt_after_cuts_a_long_cell_and_the_run_goes_on(tmp_path: Path) -> None:
    """A cell past --interrupt-after is interrupted and named; what it held is freed (IPython's
    traceback would keep the interrupted frame alive); the next cell runs in the same kernel."""
    cells = ["import time, torch",
             "def train():\n    local = torch.empty(6 * 2**20, dtype=torch.uint8)\n"
             "    time.sleep(120)\ntrain()",
             "after = torch.empty(2 * 2**20, dtype=torch.uint8)"]
    row = measure_interrupting(tmp_path, cells, 5)
    assert row["raised"] == [{"cell": "code cell 2 of 3 (starting 'def train():')",
                              "error": "CellTimeoutError: interrupted after 5 s"}]
    assert row["live_bytes"] == 2 * MIB  # `local` went with the traceback; `after` was made
    assert row["peak_bytes"] == 6 * MIB  # not 8: never alive together
    assert row["seconds"] < 60


def test_a_cell_slow_to_stop_after_the_interrupt_does_not_stop_the_run(tmp_path: Path) -> None:
    """The kernel answers the course's settle cell only after the interrupted cell has stopped.
    nbclient waits 4 s for an interrupted cell's output, then sends the next request; a cell that
    takes longer than that and --interrupt-after together to stop (here it cleans up for 10 s; CI
    saw a loaded machine take as long to print a traceback) must not make the settle cell time
    out and end the run."""
    cells = ["import time",
             "try:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    time.sleep(10)\n    raise",
             "import torch\nafter = torch.empty(2 * 2**20, dtype=torch.uint8)"]
    row = measure_interrupting(tmp_path, cells, 3)
    assert row["raised"] == [{"cell": "code cell 2 of 3 (starting 'try:')",
                              "error": "CellTimeoutError: interrupted after 3 s"}]
    assert row["live_bytes"] == 2 * MIB  # the cell after it ran
