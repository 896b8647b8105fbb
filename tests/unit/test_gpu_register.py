"""course_tools.gpu_register: the register's rows carry stable ids, every id has a check, and a
verdict fills the column "last run on a GPU" and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from course_tools.gpu_check import ROW_CHECKS
from course_tools.gpu_register import (
    ID_COLUMN,
    NEVER,
    REGISTER,
    RUN_COLUMN,
    RegisterFormatError,
    Table,
    check_ids,
    fill,
    merge,
    read_table,
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


def verdict(device: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"started": "2026-12-01T10:00:00+00:00", "device": device, "rows": rows,
            "environment": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}}


def test_a_gpu_verdict_fills_only_the_rows_it_decided() -> None:
    text = register()
    rows = [{"id": "02-bitwise", "status": "passed", "detail": "", "decides": True},
            {"id": "16-fp8", "status": "failed", "detail": "16_fp8: cell 9: ImportError: x|y",
             "decides": True},
            {"id": "14-inductor", "status": "not reached", "detail": "", "decides": True},
            {"id": "03-mps-saved", "status": "not decidable", "detail": "needs MPS",
             "decides": False}]
    filled, changed = fill(text, verdict("cuda", rows))
    assert changed == ["02-bitwise", "16-fp8"]
    table = read_table(filled)
    cell = {cells[0]: cells[-1] for cells in table.rows}
    assert cell["02-bitwise"] == "2026-12-01 · NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130: passed"
    assert cell["16-fp8"].endswith(": failed (16_fp8: cell 9: ImportError: x\\|y)")
    last = {cells[0]: cells[-1] for cells in read_table(text).rows}["14-inductor"]
    assert cell["14-inductor"] == last  # not reached: the last run stays the last run
    before, after = text.splitlines(), filled.splitlines()
    assert len(before) == len(after)
    assert [b for b, a in zip(before, after, strict=True) if b != a] == [
        line for line in before if line.startswith(("| 02-bitwise |", "| 16-fp8 |"))]
    again, _ = fill(filled, verdict("cuda", [{**rows[2], "status": "not reached"}]))
    assert again == filled


def test_a_cpu_verdict_decides_no_row() -> None:
    rows = [{"id": row_id, "status": "passed", "detail": "", "decides": False}
            for row_id in check_ids(read_table(register()))]
    assert fill(register(), verdict("cpu", rows)) == (register(), [])


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
