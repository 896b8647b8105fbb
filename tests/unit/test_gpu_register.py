"""course_tools.gpu_register: the register's rows carry stable ids, every id has a check, and a
verdict fills the column "last run on a GPU" and nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from course_tools.gpu_check import ROW_CHECKS
from course_tools.gpu_register import (
    ID_COLUMN,
    NEVER,
    REGISTER,
    RUN_COLUMN,
    UNKNOWN,
    RegisterFormatError,
    Table,
    check_ids,
    fill,
    git_history,
    merge,
    parse_cell,
    read_table,
    stale,
    stale_rows,
)


def register() -> str:
    return REGISTER.read_text(encoding="utf-8")


def test_every_row_has_an_id_and_every_id_a_check() -> None:
    table = read_table(register())
    assert table.header[0] == ID_COLUMN and table.header[-1] == RUN_COLUMN
    ids = check_ids(table)
    assert len(ids) >= 40
    assert set(ids) == set(ROW_CHECKS), "give a new row a check in gpu_check.ROW_CHECKS"


def test_rows_about_other_devices_say_what_they_need() -> None:
    table = read_table(register())
    on, run = table.column("on"), table.column(RUN_COLUMN)
    for cells in table.rows:
        check = ROW_CHECKS[cells[0]]
        if check.needs:
            assert cells[run] == f"needs {check.needs}", cells[0]
            assert "cuda" not in cells[on].replace("multi-GPU cuda", ""), cells[0]


def test_a_repeated_id_is_refused() -> None:
    table = read_table(register())
    table.rows[1][0] = table.rows[0][0]
    with pytest.raises(RegisterFormatError, match="used twice"):
        check_ids(table)


def verdict(device: str, rows: list[dict[str, Any]], preset: str = "paper") -> dict[str, Any]:
    return {"started": "2026-12-01T10:00:00+00:00", "device": device, "rows": rows,
            "preset": preset, "commit": "abc1234def5678",
            "environment": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}}


def test_a_gpu_verdict_fills_only_the_rows_it_decided() -> None:
    text = register()
    rows = [{"id": "02-bitwise", "status": "passed", "detail": "", "decides": True},
            {"id": "16-fp8", "status": "failed", "detail": "16_fp8: cell 9: ImportError: x|y",
             "decides": True},
            {"id": "14-inductor", "status": "not reached", "detail": "", "decides": True},
            {"id": "03-mps-saved", "status": "not decidable", "detail": "needs MPS",
             "decides": False}]
    filled, changed, skipped = fill(text, verdict("cuda", rows))
    assert changed == ["02-bitwise", "16-fp8"] and skipped == []
    table = read_table(filled)
    cell = {cells[0]: cells[-1] for cells in table.rows}
    assert cell["02-bitwise"] == ("2026-12-01 · NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130 · "
                                  "paper · abc1234: passed")
    assert cell["16-fp8"].endswith(": failed (16_fp8: cell 9: ImportError: x\\|y)")
    last = {cells[0]: cells[-1] for cells in read_table(text).rows}["14-inductor"]
    assert cell["14-inductor"] == last  # not reached: the last run stays the last run
    before, after = text.splitlines(), filled.splitlines()
    assert len(before) == len(after)
    assert [b for b, a in zip(before, after, strict=True) if b != a] == [
        line for line in before if line.startswith(("| 02-bitwise |", "| 16-fp8 |"))]
    again, _, _ = fill(filled, verdict("cuda", [{**rows[2], "status": "not reached"}]))
    assert again == filled


def test_a_cpu_verdict_decides_no_row() -> None:
    rows = [{"id": row_id, "status": "passed", "detail": "", "decides": False}
            for row_id in check_ids(read_table(register()))]
    assert fill(register(), verdict("cpu", rows)) == (register(), [], [])


def test_merge_gives_an_edited_copy_without_the_columns_its_ids_back() -> None:
    ours = read_table(register())
    stripped = Table(ours.before, ours.header[1:-1], [row[1:-1] for row in ours.rows],
                     ours.after)
    stripped.rows[2][3] += " Checked again on 2026-12-01."  # another branch edited a row
    stripped.rows.append(["18", "cuda", "a row another branch added", "source"])
    merged, made_up = merge(stripped.render(), register())
    table = read_table(merged)
    assert [row[0] for row in table.rows[:-1]] == [row[0] for row in ours.rows]
    assert table.rows[2][4].endswith("Checked again on 2026-12-01.")
    assert made_up == ["18-a-row-another"] and table.rows[-1][-1] == NEVER


def test_a_row_about_paper_is_not_filled_from_a_smaller_preset() -> None:
    """Issue 46: a run at ``cpu`` (or a lesson at ``--lesson-preset 14=cpu``) wrote rows whose
    claims are about ``paper``."""
    rows = [{"id": "02-bitwise", "status": "passed", "detail": "", "decides": True,
             "preset": "cpu", "claim_preset": "paper"},
            {"id": "14-inductor", "status": "failed", "detail": "x", "decides": True,
             "preset": "cpu+paper", "claim_preset": "paper"},
            {"id": "02-scaler", "status": "passed", "detail": "", "decides": True,
             "preset": "paper", "claim_preset": "paper"},
            {"id": "device-cuda-bf16", "status": "passed", "detail": "", "decides": True,
             "preset": None, "claim_preset": None}]
    filled, changed, skipped = fill(register(), verdict("cuda", rows, preset="cpu"))
    assert changed == ["02-scaler", "device-cuda-bf16"]
    assert [row_id for row_id, _ in skipped] == ["02-bitwise", "14-inductor"]
    assert skipped[0][1] == "passed at cpu, but its claim is about paper: it keeps its last run"
    cell = {cells[0]: cells[-1] for cells in read_table(filled).rows}
    last = {cells[0]: cells[-1] for cells in read_table(register()).rows}
    assert cell["02-bitwise"] == last["02-bitwise"] and cell["14-inductor"] == last["14-inductor"]
    assert cell["02-scaler"].endswith("· paper · abc1234: passed")
    assert cell["device-cuda-bf16"].endswith("· any size · abc1234: passed")
    # a verdict from before rows carried their preset: the run's preset decides, about paper
    old = [{"id": "02-bitwise", "status": "passed", "detail": "", "decides": True}]
    assert fill(register(), verdict("cuda", old, preset="cpu"))[2][0][0] == "02-bitwise"
    unknown = {**verdict("cuda", old), "commit": None}  # no --commit and no .git
    cell = {cells[0]: cells[-1] for cells in read_table(fill(register(), unknown)[0]).rows}
    assert cell["02-bitwise"].endswith("· paper · unknown: passed")
    assert parse_cell(cell["02-bitwise"]).commit == UNKNOWN


def test_cells_old_and_new_read_back() -> None:
    old = parse_cell("2026-11-26 · NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130: passed")
    assert old is not None and (old.preset, old.commit, old.status) == (UNKNOWN, UNKNOWN, "passed")
    new = parse_cell("2026-11-27 · NVIDIA H200 · torch 2.11.0+cu130 · paper · abc1234: failed "
                     "(16_fp8: lesson 16 ran no FP8 training: torchao (x))")
    assert new is not None and (new.gpu, new.preset, new.commit) == ("NVIDIA H200", "paper",
                                                                     "abc1234")
    assert new.detail == "16_fp8: lesson 16 ran no FP8 training: torchao (x)"
    assert parse_cell("never") is None and parse_cell("needs MPS") is None
    for cells in read_table(register()).rows:  # every cell of the register reads
        assert cells[-1] in (NEVER,) or cells[-1].startswith("needs ") or parse_cell(cells[-1])


def small_register(cells: dict[str, tuple[str, str]]) -> Table:
    return read_table("## Lessons\n\n| id | lesson | on | last run on a GPU |\n"
                      "| --- | --- | --- | --- |\n" + "".join(
                          f"| {row_id} | {lessons} | cuda | {cell} |\n"
                          for row_id, (lessons, cell) in cells.items()))


def test_a_row_decided_before_its_lesson_changed_is_stale() -> None:
    history = ["c5" * 20, "c4" * 20, "c3" * 20, "c2" * 20, "c1" * 20]  # newest first
    run = "2026-12-01 · H100 · torch 2.11 · paper · {}: passed"
    table = small_register({
        "14-a": ("14", run.format("c3c3c3c")),  # 14 changed in c4: stale
        "16-a": ("16", run.format("c3c3c3c")),  # 16 changed in c2: still current
        "09-10": ("09, 10", run.format("c2c2c2c")),  # 10 changed in c3
        "bench": ("03, bench", run.format("c5c5c5c")),
        "old": ("16", "2026-11-26 · H100 · torch 2.11.0+cu130: passed"),
        "gone": ("16", run.format("dddddd0")),
        "never": ("16", "never")})
    changed_at = {"14": "c4" * 20, "16": "c2" * 20, "09": None, "10": "c3" * 20,
                  "03": "c5" * 20}
    found = {row_id: (kind, why) for row_id, kind, why in stale_rows(table, history, changed_at)}
    assert found == {
        "14-a": ("stale", "decided at c3c3c3c; since then lesson 14 changed in c4c4c4c"),
        "09-10": ("stale", "decided at c2c2c2c; since then lesson 10 changed in c3c3c3c"),
        "old": (UNKNOWN, "decided 2026-11-26 at an unknown commit"),
        "gone": (UNKNOWN, "decided at dddddd0, which is not in this branch's history")}


def test_stale_reads_the_history_from_git(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "notebooks").mkdir()
    for name in ("14_compile.py", "16_fp8.py"):
        (tmp_path / "notebooks" / name).write_text("# %%\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    first = git("rev-parse", "HEAD")
    (tmp_path / "notebooks" / "14_compile.py").write_text("# %%\nprint(1)\n")
    git("commit", "-q", "-am", "lesson 14 changed")
    second = git("rev-parse", "HEAD")
    history, changed_at = git_history(tmp_path, ["14", "16"])
    assert history == [second, first] and changed_at == {"14": second, "16": first}
    text = small_register({"14-a": ("14", f"2026-12-01 · H100 · torch 2.11 · paper · "
                                           f"{first[:7]}: passed"),
                           "16-a": ("16", f"2026-12-01 · H100 · torch 2.11 · paper · "
                                           f"{first[:7]}: passed")}).render()
    assert [(row_id, kind) for row_id, kind, _ in stale(text, tmp_path)] == [("14-a", "stale")]
