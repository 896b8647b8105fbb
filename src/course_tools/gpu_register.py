"""The register of GPU-only code (``docs/gpu-register.md``) as data, and its column "last run on a
GPU" filled from a ``course_tools.gpu_check`` verdict: ``python -m course_tools.gpu_register
fill VERDICT.json``.

Each row of the register's table carries a stable id in its first column (``02-bitwise``), which
the verdict's rows name; ``gpu_check.ROW_CHECKS`` maps each id to what decides it. ``fill`` writes
"date · GPU · torch: passed" (or "failed: the first error line") into every row a GPU run decided,
"needs MPS" (ROCm, XPU, 2+ GPUs) where a single CUDA GPU cannot decide the row, and leaves a row
the run did not reach as it was: its last run stays the last run. A verdict from a CPU run decides
no row and changes only the "needs" cells.

``python -m course_tools.gpu_register merge OTHER.md IDS.md`` gives each row of ``OTHER.md``
(a version of the register without the id and last-run columns, such as a branch that edited
rows' text) the id and last-run cell of its row in ``IDS.md``, matched by lesson, device and text.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTER = Path(__file__).resolve().parents[2] / "docs" / "gpu-register.md"
TABLE_HEADING = "## Lessons"
ID_COLUMN = "id"
RUN_COLUMN = "last run on a GPU"
NEVER = "never"
ROW_ID = re.compile(r"^[0-9a-z][0-9a-z-]*$")


class RegisterFormatError(ValueError):
    """The register's table is not where or what this tool expects."""


@dataclass
class Table:
    """The register's table: the lines before and after it, its header, and its rows' cells."""

    before: list[str]
    header: list[str]
    rows: list[list[str]]
    after: list[str]

    def column(self, name: str) -> int:
        try:
            return self.header.index(name)
        except ValueError:
            raise RegisterFormatError(f"the register's table has no column {name!r}; its "
                                      f"columns are {self.header}") from None

    def ids(self) -> list[str]:
        column = self.column(ID_COLUMN)
        return [row[column] for row in self.rows]

    def render(self) -> str:
        lines = [*self.before, _line(self.header), _line(["---"] * len(self.header)),
                 *(_line(row) for row in self.rows), *self.after]
        return "\n".join(lines) + "\n"


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cells(line: str) -> list[str]:
    """A table line's cells; ``\\|`` inside a cell is text, not a border."""
    inner = line.strip()[1:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", inner)]


def read_table(text: str) -> Table:
    """The first table after the ``## Lessons`` heading."""
    lines = text.rstrip("\n").split("\n")
    try:
        start = lines.index(TABLE_HEADING)
    except ValueError:
        raise RegisterFormatError(f"the register has no {TABLE_HEADING!r} heading") from None
    first = next((i for i in range(start, len(lines)) if lines[i].startswith("|")), None)
    if first is None:
        raise RegisterFormatError(f"no table under {TABLE_HEADING!r}")
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    header = _cells(lines[first])
    rows = [_cells(line) for line in lines[first + 2:end]]
    for row in rows:
        if len(row) != len(header):
            raise RegisterFormatError(f"a row has {len(row)} cells, the header {len(header)}: "
                                      f"{_line(row)[:80]}")
    return Table(lines[:first], header, rows, lines[end:])


def check_ids(table: Table) -> list[str]:
    """Each row's id; raises if one is missing, malformed or repeated."""
    ids = table.ids()
    for row_id in ids:
        if not ROW_ID.match(row_id):
            raise RegisterFormatError(f"row id {row_id!r} is not lower-case letters, digits and "
                                      "dashes")
    repeated = sorted({row_id for row_id in ids if ids.count(row_id) > 1})
    if repeated:
        raise RegisterFormatError(f"row ids used twice: {', '.join(repeated)}")
    return ids


def run_cell(verdict: dict[str, Any], row: dict[str, Any]) -> str | None:
    """What the verdict writes into a row's "last run on a GPU" cell; None: leave it."""
    status = row["status"]
    if status == "not decidable":
        return row["detail"]  # "needs MPS"
    if not row.get("decides") or status not in ("passed", "failed"):
        return None
    env = verdict["environment"]
    text = (f"{verdict['started'][:10]} · {env.get('gpu') or verdict['device']} · "
            f"torch {env.get('torch')}: {status}")
    if status == "failed":
        text += f" ({row['detail']})"
    return text.replace("|", "\\|").replace("\n", " ")


def fill(text: str, verdict: dict[str, Any]) -> tuple[str, list[str]]:
    """The register with the verdict's rows written in; also the ids it changed."""
    table = read_table(text)
    check_ids(table)
    id_column, run_column = table.column(ID_COLUMN), table.column(RUN_COLUMN)
    verdicts = {row["id"]: row for row in verdict["rows"]}
    changed = []
    for cells in table.rows:
        row = verdicts.get(cells[id_column])
        new = None if row is None else run_cell(verdict, row)
        if new is None and not cells[run_column]:
            new = NEVER
        if new is not None and new != cells[run_column]:
            cells[run_column] = new
            changed.append(cells[id_column])
    return table.render(), changed


def _key(table: Table, cells: list[str]) -> str:
    return " ".join(cell for name, cell in zip(table.header, cells, strict=True)
                    if name not in (ID_COLUMN, RUN_COLUMN))


def merge(other: str, with_ids: str) -> tuple[str, list[str]]:
    """``other``'s table with the id and last-run columns of ``with_ids`` added, each row matched
    to the most alike row of the same lesson and device there; also the ids made up for rows
    that had no match (new rows: give them a check in ``gpu_check.ROW_CHECKS``)."""
    theirs, ours = read_table(other), read_table(with_ids)
    if ID_COLUMN in theirs.header:
        return other, []
    id_column, run_column = ours.column(ID_COLUMN), ours.column(RUN_COLUMN)
    free = list(ours.rows)
    made_up = []
    rows = []
    for cells in theirs.rows:
        same_place = [row for row in free if row[id_column + 1:id_column + 3] == cells[:2]]
        best = max(same_place or free, default=None, key=lambda row: difflib.SequenceMatcher(
            None, _key(ours, row), " ".join(cells)).ratio())
        alike = best is not None and difflib.SequenceMatcher(
            None, _key(ours, best), " ".join(cells)).ratio() > 0.5
        if alike and best is not None:
            free.remove(best)
            rows.append([best[id_column], *cells, best[run_column]])
        else:
            words = re.findall(r"[a-z0-9]+", f"{cells[0]} {cells[2]}".lower())[:4]
            row_id = "-".join(words) or "row"
            made_up.append(row_id)
            rows.append([row_id, *cells, NEVER])
    table = Table(theirs.before, [ID_COLUMN, *theirs.header, RUN_COLUMN], rows, theirs.after)
    return table.render(), made_up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_tools.gpu_register",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fill_parser = sub.add_parser("fill", help="write a verdict's rows into the register")
    fill_parser.add_argument("verdict", type=Path, help="verdict.json of course_tools.gpu_check")
    fill_parser.add_argument("--register", type=Path, default=REGISTER)
    merge_parser = sub.add_parser("merge", help="add the id and last-run columns to another "
                                  "version of the register; prints it")
    merge_parser.add_argument("other", type=Path, help="the register without the columns")
    merge_parser.add_argument("with_ids", type=Path, help="the register with them")
    sub.add_parser("ids", help="print every row's id")
    args = parser.parse_args(argv)
    if args.command == "fill":
        verdict = json.loads(args.verdict.read_text(encoding="utf-8"))
        text, changed = fill(args.register.read_text(encoding="utf-8"), verdict)
        args.register.write_text(text, encoding="utf-8")
        print(f"{args.register}: {len(changed)} rows written ({', '.join(changed) or 'none'})")
    elif args.command == "merge":
        text, made_up = merge(args.other.read_text(encoding="utf-8"),
                              args.with_ids.read_text(encoding="utf-8"))
        sys.stdout.write(text)
        for row_id in made_up:
            print(f"warning: a new row got the id {row_id!r}: give it a check in "
                  "course_tools.gpu_check.ROW_CHECKS", file=sys.stderr)
    else:
        print("\n".join(check_ids(read_table(REGISTER.read_text(encoding="utf-8")))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
