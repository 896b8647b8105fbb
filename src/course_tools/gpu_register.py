"""The register of GPU-only code (``docs/gpu-register.md``) as data, and its column "last run on a
GPU" filled from a ``course_tools.gpu_check`` verdict: ``python -m course_tools.gpu_register
fill VERDICT.json``.

Each row of the register's table carries a stable id in its first column (``02-bitwise``), which
the verdict's rows name; ``gpu_check.ROW_CHECKS`` maps each id to what decides it. ``fill`` writes
"date · GPU · torch · preset · commit: passed" (or "failed (the first error line)") into every row
a GPU run decided, "needs MPS" (ROCm, XPU, 2+ GPUs) where a single CUDA GPU cannot decide the row,
and leaves a row the run did not reach as it was: its last run stays the last run. A row whose
check runs a lesson or the bench is about ``paper`` (``CLAIM_PRESET``): a run at another preset
leaves it as it was too, and ``fill`` says it skipped it. A verdict from a CPU run decides no row
and changes only the "needs" cells. Cells written before presets and commits were stamped
("date · GPU · torch: passed") read as preset and commit "unknown".

``python -m course_tools.gpu_register stale`` lists the rows whose last run was at a commit older
than the last commit that changed one of the row's lessons (``git log -- notebooks/NN_*.py``), and
those whose commit is unknown.

``python -m course_tools.gpu_register merge OTHER.md IDS.md`` gives each row of ``OTHER.md``
(a version of the register without the id and last-run columns, such as a branch that edited
rows' text) the id and last-run cell of its row in ``IDS.md``, matched by lesson, device and text.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
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
CLAIM_PRESET = "paper"  # the size every lesson's GPU claim is about (docs/testing.md)
ANY_SIZE = "any size"  # the preset part of a cell whose row is about no size (a probe)
UNKNOWN = "unknown"
LESSON_COLUMN = "lesson"
RUN_CELL = re.compile(  # what run_cell writes; the preset and commit are missing in older cells
    r"^(?P<date>\d{4}-\d\d-\d\d) · (?P<gpu>.+?) · torch (?P<torch>[^\s:]+)"
    r"(?: · (?P<preset>[^·:]+?) · (?P<commit>[0-9a-f]+|unknown))?: (?P<status>passed|failed)"
    r"(?: \((?P<detail>.*)\))?$")


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


@dataclass(frozen=True)
class RunCell:
    """A "last run on a GPU" cell read back; ``preset`` and ``commit`` are "unknown" in a cell
    written before they were stamped."""

    date: str
    gpu: str
    torch: str
    preset: str
    commit: str
    status: str
    detail: str | None


def parse_cell(cell: str) -> RunCell | None:
    """A cell that records a GPU run, read; None for "never", "needs ..." and anything else."""
    match = RUN_CELL.match(cell.strip())
    if match is None:
        return None
    parts = match.groupdict()
    return RunCell(parts["date"], parts["gpu"], parts["torch"], parts["preset"] or UNKNOWN,
                   parts["commit"] or UNKNOWN, parts["status"], parts["detail"])


def row_sizes(verdict: dict[str, Any], row: dict[str, Any]) -> tuple[str | None, str | None]:
    """The preset a row ran at (None: a row about no size) and the preset its claim is about.
    A verdict from before rows carried them: the run's preset, and ``paper``."""
    preset = row["preset"] if "preset" in row else verdict.get("preset")
    claim = row["claim_preset"] if "claim_preset" in row else CLAIM_PRESET
    return preset, claim


def run_cell(verdict: dict[str, Any], row: dict[str, Any]) -> str | None:
    """What the verdict writes into a row's "last run on a GPU" cell; None: leave it (also a
    row about ``paper`` that ran at another preset: ``skip_reason``)."""
    status = row["status"]
    if status == "not decidable":
        return row["detail"]  # "needs MPS"
    if not row.get("decides") or status not in ("passed", "failed") or skip_reason(verdict, row):
        return None
    env = verdict["environment"]
    preset, _ = row_sizes(verdict, row)
    commit = str(verdict.get("commit") or UNKNOWN)
    text = (f"{verdict['started'][:10]} · {env.get('gpu') or verdict['device']} · "
            f"torch {env.get('torch')} · {preset or ANY_SIZE} · "
            f"{commit if commit == UNKNOWN else commit[:7]}: {status}")
    if status == "failed":
        text += f" ({row['detail']})"
    return text.replace("|", "\\|").replace("\n", " ")


def skip_reason(verdict: dict[str, Any], row: dict[str, Any]) -> str | None:
    """Why a decided row is not written: its claim is about a size the run did not use."""
    if not row.get("decides") or row["status"] not in ("passed", "failed"):
        return None
    preset, claim = row_sizes(verdict, row)
    if claim is not None and preset != claim:
        return (f"{row['status']} at {preset}, but its claim is about {claim}: it keeps its "
                "last run")
    return None


def fill(text: str, verdict: dict[str, Any]) -> tuple[str, list[str], list[tuple[str, str]]]:
    """The register with the verdict's rows written in; also the ids it changed, and the rows it
    skipped because they ran at another size than their claim's (id, why)."""
    table = read_table(text)
    check_ids(table)
    id_column, run_column = table.column(ID_COLUMN), table.column(RUN_COLUMN)
    verdicts = {row["id"]: row for row in verdict["rows"]}
    changed, skipped = [], []
    for cells in table.rows:
        row = verdicts.get(cells[id_column])
        new = None if row is None else run_cell(verdict, row)
        why = None if row is None else skip_reason(verdict, row)
        if why:
            skipped.append((cells[id_column], why))
        if new is None and not cells[run_column]:
            new = NEVER
        if new is not None and new != cells[run_column]:
            cells[run_column] = new
            changed.append(cells[id_column])
    return table.render(), changed, skipped


def stale_rows(table: Table, history: list[str],
               changed_at: dict[str, str | None]) -> list[tuple[str, str, str]]:
    """The rows whose last GPU run does not cover their lessons as they are: ``("stale", why)``
    where a commit that changed one of the row's lessons (the register's lesson column) came after
    the commit the row was decided at, ``("unknown", why)`` where that commit is not known or not
    in ``history``. ``history``: the commits, newest first (``git rev-list HEAD``);
    ``changed_at``: per lesson number, the newest commit that changed it (None: never)."""
    id_column, run_column = table.column(ID_COLUMN), table.column(RUN_COLUMN)
    lesson_column = table.column(LESSON_COLUMN)
    place = {commit: index for index, commit in enumerate(history)}
    found = []
    for cells in table.rows:
        run = parse_cell(cells[run_column])
        numbers = re.findall(r"\b\d\d\b", cells[lesson_column])
        if run is None or not numbers:
            continue
        row_id = cells[id_column]
        if run.commit == UNKNOWN:
            found.append((row_id, UNKNOWN, f"decided {run.date} at an unknown commit"))
            continue
        at = next((i for commit, i in place.items() if commit.startswith(run.commit)), None)
        if at is None:
            found.append((row_id, UNKNOWN, f"decided at {run.commit}, which is not in this "
                          "branch's history"))
            continue
        newer = [(n, changed_at[n]) for n in numbers if changed_at.get(n)
                 and place.get(changed_at[n], len(history)) < at]
        if newer:
            found.append((row_id, "stale", f"decided at {run.commit}; since then " + ", ".join(
                f"lesson {n} changed in {str(c)[:7]}" for n, c in newer)))
    return found


def git_history(repo: Path, numbers: list[str]) -> tuple[list[str], dict[str, str | None]]:
    """``stale_rows``' inputs from git: the commits of HEAD, newest first, and per lesson number
    the newest commit that changed ``notebooks/NN_*.py``."""
    def git(*args: str) -> list[str]:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True)
        return done.stdout.split()

    history = git("rev-list", "HEAD")
    changed_at = {n: next(iter(git("log", "-1", "--format=%H", "--", f"notebooks/{n}_*.py")),
                          None) for n in numbers}
    return history, changed_at


def stale(text: str, repo: Path) -> list[tuple[str, str, str]]:
    """``stale_rows`` of the register ``text`` against the git checkout at ``repo``."""
    table = read_table(text)
    numbers = sorted({n for cells in table.rows
                      for n in re.findall(r"\b\d\d\b", cells[table.column(LESSON_COLUMN)])})
    return stale_rows(table, *git_history(repo, numbers))


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
    stale_parser = sub.add_parser("stale", help="list the rows decided before their lesson "
                                  "last changed, or at an unknown commit (needs git)")
    stale_parser.add_argument("--register", type=Path, default=REGISTER)
    stale_parser.add_argument("--repo", type=Path, default=REGISTER.parents[1])
    sub.add_parser("ids", help="print every row's id")
    args = parser.parse_args(argv)
    if args.command == "fill":
        verdict = json.loads(args.verdict.read_text(encoding="utf-8"))
        text, changed, skipped = fill(args.register.read_text(encoding="utf-8"), verdict)
        args.register.write_text(text, encoding="utf-8")
        print(f"{args.register}: {len(changed)} rows written ({', '.join(changed) or 'none'})")
        for row_id, why in skipped:
            print(f"skipped {row_id}: {why}")
    elif args.command == "stale":
        found = stale(args.register.read_text(encoding="utf-8"), args.repo)
        for row_id, kind, why in found:
            print(f"{kind} {row_id}: {why}")
        print(f"{sum(kind == 'stale' for _, kind, _ in found)} rows stale, "
              f"{sum(kind == UNKNOWN for _, kind, _ in found)} at an unknown commit")
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
