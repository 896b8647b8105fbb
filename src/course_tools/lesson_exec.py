"""Run one lesson top to bottom in this process, without Jupyter: ``python -m
course_tools.lesson_exec LESSON.py RESULT.json``.

The lent GPU machine has torch but no jupytext, nbformat, nbclient, ipykernel or IPython, and
reaches no registry, so ``course_tools.gpu_check`` runs each lesson through this module instead of
nbval or the handout. The lesson's py:percent text is split into cells here (a line starting
``# %%`` opens a cell; ``[markdown]`` and ``[raw]`` cells are skipped), each exercise cell's source
is replaced by its reference answer from ``amp_tutorial.exercises.solutions`` (as
``course_tools.answers`` does), and the code cells are executed in order in one namespace, as a
kernel would. ``IPython.display`` is replaced by a stand-in that prints (``display``,
``Markdown``, ``HTML``), so the run is the same with or without IPython installed; matplotlib draws
on Agg and progress bars are off.

Every code cell runs even after one raises (the first error is the lesson's verdict; a later
``NameError`` is usually its echo). After each cell the result file is rewritten, so a run killed
at its time limit still says which cells passed and which one was running. On a CUDA or XPU GPU
the allocator's peak over the whole lesson (``live_memory.AllocatorPeak``, also across the
lesson's own resets) is part of the result; it is null on a CPU.
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import re
import resource
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amp_tutorial.exercises.solutions import FOLDER as SOLUTIONS

CELL_MARKER = re.compile(r"^# %%(.*)$")
CELL_KIND = re.compile(r"^\s*\[(\w+)\]")  # `# %% [markdown]`
CELL_OPTION = re.compile(r"(\w[\w-]*)=(\"[^\"]*\"|\[[^\]]*\])")  # tags=["exercise"] solution="x.py"
EXERCISE_TAG = "exercise"
SKIP_TAG = "skip-execution"  # and nbval's NBVAL_SKIP
RAISES_TAG = "raises-exception"


class LessonFormatError(ValueError):
    """The lesson's text is not a py:percent notebook this runner can read."""


@dataclass
class Cell:
    """One code cell: its number among the code cells (1-based, as people count), its source,
    and its tags; ``solution`` names the answer file an exercise cell runs instead."""

    number: int
    source: str
    tags: list[str] = field(default_factory=list)
    solution: str | None = None

    @property
    def first_line(self) -> str:
        return next((line for line in self.source.splitlines() if line.strip()), "")


def _options(text: str) -> dict[str, Any]:
    options = {}
    for key, value in CELL_OPTION.findall(text):
        options[key] = json.loads(value)
    return options


def read_cells(path: Path, solutions: Path | None = None) -> list[Cell]:
    """The code cells of the py:percent lesson at ``path``, exercise cells holding the reference
    answer from ``solutions`` (default: the course's, ``amp_tutorial.exercises.solutions``)."""
    solutions = solutions or SOLUTIONS
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip() == "# ---":  # the jupytext header, up to its closing `# ---`
        try:
            lines = lines[lines.index("# ---", 1) + 1:]
        except ValueError:
            raise LessonFormatError(f"{path.name}: the header opened by '# ---' never closes"
                                    ) from None
    chunks: list[tuple[str, list[str]]] = [("", [])]  # (marker text, lines)
    for line in lines:
        match = CELL_MARKER.match(line)
        if match:
            chunks.append((match.group(1), []))
        else:
            chunks[-1][1].append(line)
    cells: list[Cell] = []
    for marker, body in chunks:
        kind = CELL_KIND.match(marker)
        if kind and kind.group(1) in ("markdown", "md", "raw"):
            continue
        source = "\n".join(body).strip("\n")
        if not source.strip():
            continue
        options = _options(marker)
        tags = list(options.get("tags", []))
        solution = options.get("solution")
        if EXERCISE_TAG in tags:
            if not solution or not (solutions / solution).is_file():
                raise LessonFormatError(
                    f"{path.name}: exercise cell needs solution=\"NAME.py\" naming a file in "
                    f"{solutions}; got {solution!r}")
            source = (solutions / solution).read_text(encoding="utf-8")
        cells.append(Cell(len(cells) + 1, source, tags, solution))
    return cells


def install_display_stand_in() -> None:
    """Put a printing ``IPython.display`` in ``sys.modules`` (the lessons' only IPython use)."""

    class _Text:
        def __init__(self, data: str = "") -> None:
            self.data = data

        def __repr__(self) -> str:
            return self.data

    class Markdown(_Text):
        pass

    class HTML(_Text):
        pass

    def display(*objects: Any, **_: Any) -> None:
        for obj in objects:
            print(obj.to_string() if hasattr(obj, "to_string") else repr(obj))

    package = types.ModuleType("IPython")
    package.get_ipython = lambda: None  # pandas, tqdm and matplotlib ask whether a kernel runs
    # matplotlib's canvas reads the version (backend_bases._fix_ipython_backend2gui); from 8.24
    # IPython sets the backend itself, so matplotlib does nothing: right where there is no shell
    package.version_info, package.__version__ = (8, 24, 0), "8.24.0"
    module = types.ModuleType("IPython.display")
    module.display, module.Markdown, module.HTML = display, Markdown, HTML
    package.display = module
    sys.modules["IPython"], sys.modules["IPython.display"] = package, module


def first_error_line(error: BaseException) -> str:
    """``"AssertionError: the message's first line"``: what a verdict shows of an error."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _run_cell(cell: Cell, namespace: dict[str, Any], filename: str) -> None:
    """Execute a cell as a kernel would: the last expression's value is shown."""
    linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
    tree = ast.parse(cell.source, filename)
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - the lesson is the program
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)  # noqa: S307
        if value is not None:
            sys.modules["IPython.display"].display(value)
    else:
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102


class _Peak:
    """The allocator's peak over the lesson on a GPU; None on a CPU (or before torch is used)."""

    def __init__(self) -> None:
        self._peak: Any = None

    def install(self) -> None:
        import torch

        if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
            from course_tools.live_memory import AllocatorPeak

            self._peak = AllocatorPeak().install()

    def read(self) -> dict[str, int] | None:
        return None if self._peak is None else self._peak.read()

    @staticmethod
    def gpu_started() -> bool:
        """Whether this process started a GPU runtime (lesson 11's DDP runs in CPU children)."""
        import torch

        return torch.cuda.is_initialized() or (hasattr(torch, "xpu") and torch.xpu.is_initialized())


def run_lesson(path: Path, result_path: Path, solutions: Path | None = None,
               namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every code cell of the lesson at ``path``; write and return the result. ``namespace``:
    a dict the cells run in, for a caller that reads what the lesson left there."""
    started = time.perf_counter()
    result: dict[str, Any] = {"lesson": path.stem, "cells": [], "first_error": None,
                              "finished": False, "seconds": 0.0, "max_memory_allocated": None,
                              "gpu_started": False}

    def write() -> None:
        result["seconds"] = round(time.perf_counter() - started, 3)
        result["cpu_s"] = round(cpu_seconds(), 3)
        tmp = result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
        tmp.replace(result_path)

    try:
        cells = read_cells(path, solutions)
    except (OSError, LessonFormatError) as error:
        result["first_error"] = {"cell": None, "error": first_error_line(error)}
        write()
        return result
    result["cells"] = [{"cell": c.number, "first_line": c.first_line, "status": "not reached"}
                       for c in cells]
    os.environ["MPLBACKEND"] = "Agg"
    os.environ.setdefault("TQDM_DISABLE", "1")
    install_display_stand_in()
    peak = _Peak()
    try:
        peak.install()
    except Exception as error:  # noqa: BLE001 - the lesson's own cells will say more
        result["peak_error"] = first_error_line(error)
    namespace = {} if namespace is None else namespace
    namespace.update(__name__="__main__", __builtins__=builtins)
    write()
    for cell, entry in zip(cells, result["cells"], strict=True):
        if SKIP_TAG in cell.tags or "NBVAL_SKIP" in cell.tags:
            entry["status"] = "skipped"
            continue
        entry["status"] = "running"
        write()
        cell_start = time.perf_counter()
        print(f"--- {path.stem} cell {cell.number}: {cell.first_line}", flush=True)
        try:
            _run_cell(cell, namespace, f"<{path.stem} cell {cell.number}>")
            raised = None
        except BaseException as error:  # noqa: BLE001 - a lesson's SystemExit is a failure too
            raised = error
            if isinstance(error, KeyboardInterrupt):
                raise
            traceback.print_exc()
        entry["seconds"] = round(time.perf_counter() - cell_start, 3)
        expected = RAISES_TAG in cell.tags
        if (raised is None) != expected:
            entry["status"] = "passed"
        else:
            entry["status"] = "failed"
            entry["error"] = (first_error_line(raised) if raised is not None
                              else "the cell is tagged raises-exception but raised nothing")
            if result["first_error"] is None:
                result["first_error"] = {"cell": cell.number, "first_line": cell.first_line,
                                         "error": entry["error"]}
        _close_figures()
        try:
            result["max_memory_allocated"] = peak.read()
            result["gpu_started"] = peak.gpu_started()
        except Exception as error:  # noqa: BLE001
            result["peak_error"] = first_error_line(error)
        write()
    result["finished"] = True
    write()
    return result


def cpu_seconds() -> float:
    """CPU time of this process and the children it waited for (torchrun's), user and system:
    what a lesson cost on a shared machine, where its wall time says little."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _close_figures() -> None:
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m course_tools.lesson_exec LESSON.py RESULT.json [SOLUTIONS/]",
              file=sys.stderr)
        return 2
    result = run_lesson(Path(args[0]), Path(args[1]), Path(args[2]) if len(args) == 3 else None)
    return 0 if result["first_error"] is None else 1


if __name__ == "__main__":
    raise SystemExit(main())

