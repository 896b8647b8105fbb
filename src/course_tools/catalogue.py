"""The course's lessons as data: number, title, and the metadata each lesson's header carries.

This module is the one definition of a lesson, used by the test run (the root ``conftest.py``),
the handout, the lab launcher and the tests: a file ``NN_name.py`` (two digits, an underscore) in
the course folder, ``notebooks/`` (``_template.py`` is not one). Its title is its ``# # NN ·
Title`` line. Its jupytext header holds an ``amp_tutorial`` block that the README's table of
lessons, the tests and the handout read::

    #   amp_tutorial:
    #     minutes:          # whole lesson, kernel start included, on the README's reference CPU
    #       cpu: 13.6
    #       smoke: 1.0
    #     memory:           # peak of live tensor memory of the lesson's kernel, MiB
    #       paper: 3136
    #     process_memory:   # only a lesson that starts processes (11: torchrun): each one, MiB
    #       paper: 180
    #     needs: any device, CPU included; ...   # what it takes to run every part
    #     track: core       # core (the workshop day) or advanced
    #     learner_minutes: 60   # a person's time: reading, running, its exercises (see below)

``python -m course_tools.catalogue table`` prints the README's table from these blocks (a test
keeps the README equal to it), and ``python -m course_tools.catalogue record timings.json`` writes
the minutes a ``pdm run handout --preset P`` run measured into the lessons' headers.
``python -m course_tools.memory --record`` writes the memory figures, in MiB (2**20 bytes):
measured on a CPU at the preset's sizes, they are what the lesson needs on a GPU, less what a
CPU cannot see (docs/workshop.md).
**Learner time** is not machine time: ``learner_time`` counts what a person reads and does, at
rates measured on the rendered course (2026-11-27): prose at ``WORDS_PER_MINUTE``, code at
``CODE_LINES_PER_MINUTE`` (non-blank lines that are not only a comment), ``EXERCISE_MINUTES`` per
graded exercise (15-35 minutes measured; the middle), ``QUIZ_QUESTION_MINUTES`` per quiz question.
"Try it" items are extra practice and add nothing. ``python -m course_tools.catalogue
learner-time --record`` writes each lesson's figure into its header; a test keeps them equal, and
the core track within ``WORKSHOP_DAY_MINUTES``.
``python -m course_tools.catalogue uses`` prints which lessons import each helper module, read
from the lessons' import statements (no docstring keeps that list by hand).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jupytext

NOTEBOOKS_ENV = "AMP_TUTORIAL_NOTEBOOKS"
LESSON_NAME = re.compile(r"^\d\d_\w+\.py$")  # 03_amp_training.py; not _template.py
LESSON_GLOB = "[0-9][0-9]_*.py"  # the same files, for a glob (LESSON_NAME still decides)
HELPER_PACKAGE = "amp_tutorial"
TITLE_LINE = re.compile(r"^# # (\d\d) · (.+?)\s*$", re.MULTILINE)  # `# # 03 · Training with AMP`
METADATA_KEY = "amp_tutorial"
TABLE_PRESETS = ("smoke", "small", "cpu")  # the presets the README's table gives a time for
MEMORY_PRESET = "paper"  # the preset the README's table gives the memory of (a GPU's sizes)
TRACKS = ("core", "advanced")  # core: the workshop day; advanced: after it, in any order
WORKSHOP_DAY_MINUTES = 360  # a workshop day's contact time, about 6 h: the core track fits it
WORDS_PER_MINUTE = 150  # dense technical prose, read with care
CODE_LINES_PER_MINUTE = 8  # read, run and look at the output
EXERCISE_MINUTES = 25  # one graded exercise: 15-35 minutes measured
QUIZ_QUESTION_MINUTES = 1
QUIZ_SOLUTION = re.compile(r"^quiz.*\.py$")  # an exercise cell whose solution is a quiz's answers


def notebooks_dir() -> Path:
    """The course folder: $AMP_TUTORIAL_NOTEBOOKS, the checkout's notebooks/, or ./notebooks."""
    if os.environ.get(NOTEBOOKS_ENV):
        return Path(os.environ[NOTEBOOKS_ENV]).resolve()
    checkout = Path(__file__).resolve().parents[2] / "notebooks"
    return checkout if checkout.is_dir() else Path.cwd() / "notebooks"


def is_lesson(path: Path) -> bool:
    """Whether ``path`` is a lesson by its name, ``NN_name.py``, wherever the course folder is
    (the checkout's notebooks/, the image's, a learner's copy under the hub)."""
    return bool(LESSON_NAME.match(path.name))


def lesson_paths(notebooks: Path | None = None) -> list[Path]:
    """Every lesson file of the course folder, in course order."""
    folder = notebooks or notebooks_dir()
    return [path for path in sorted(folder.glob(LESSON_GLOB)) if is_lesson(path)]


@dataclass(frozen=True)
class Lesson:
    """One lesson file, the number and title from its ``# # NN · Title`` line, and its metadata.
    """

    path: Path
    number: str
    title: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def page(self) -> str:
        return f"{self.name}.html"

    @property
    def heading(self) -> str:
        return f"{self.number} · {self.title}"

    @property
    def minutes(self) -> dict[str, float]:
        """Measured run time of the whole lesson per preset, in minutes."""
        return dict(self.metadata.get("minutes") or {})

    @property
    def memory(self) -> dict[str, int]:
        """Peak of live tensor memory of the lesson's kernel per preset, in MiB."""
        return dict(self.metadata.get("memory") or {})

    @property
    def process_memory(self) -> dict[str, int]:
        """For a lesson that starts processes of its own (torchrun), each one's peak, in MiB."""
        return dict(self.metadata.get("process_memory") or {})

    @property
    def track(self) -> str:
        """``core`` (the workshop day) or ``advanced``; empty where the header says neither."""
        return str(self.metadata.get("track") or "")

    @property
    def learner_minutes(self) -> int | None:
        """A person's time for the lesson, as recorded in its header (``learner_time``)."""
        value = self.metadata.get("learner_minutes")
        return None if value is None else int(value)

    @property
    def needs(self) -> str:
        """What the lesson needs to run every part (all lessons run on a CPU)."""
        return str(self.metadata.get("needs") or "")


def read_lesson(path: Path) -> Lesson:
    """The lesson at ``path``: its number, title and header metadata."""
    text = path.read_text(encoding="utf-8")
    match = TITLE_LINE.search(text)
    number, title = match.groups() if match else (path.name[:2], path.stem[3:])
    metadata = jupytext.reads(text, fmt="py:percent").metadata.get(METADATA_KEY, {})
    return Lesson(path, number, title, dict(metadata))


@dataclass(frozen=True)
class LearnerTime:
    """What a person reads and does in a lesson, and the minutes that takes at the rates above."""

    words: int
    code_lines: int
    exercises: int
    quiz_questions: int

    @property
    def minutes(self) -> int:
        """Rounded up to 5 minutes: the figure is an estimate for planning a day."""
        exact = (self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE
                 + self.exercises * EXERCISE_MINUTES
                 + self.quiz_questions * QUIZ_QUESTION_MINUTES)
        return 5 * -(-round(exact) // 5)


def _quiz_questions(source: str) -> int:
    """How many questions a quiz cell asks: the keys of the dict its stub assigns."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            return len(node.keys)
    return 0


def learner_time(path: Path) -> LearnerTime:
    """Count the lesson's prose words, code lines, graded exercises and quiz questions."""
    notebook = jupytext.read(path)
    words = code_lines = exercises = questions = 0
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            words += len(cell.source.split())
            continue
        if cell.cell_type != "code":
            continue
        code_lines += sum(1 for line in cell.source.splitlines()
                          if line.strip() and not line.strip().startswith("#"))
        if "exercise" in cell.metadata.get("tags", ()):
            if QUIZ_SOLUTION.match(str(cell.metadata.get("solution", ""))):
                questions += _quiz_questions(cell.source)
            else:
                exercises += 1
    return LearnerTime(words, code_lines, exercises, questions)


def track_minutes(lessons: Sequence[Lesson]) -> dict[str, int]:
    """Each track's learner minutes, from the headers."""
    return {track: sum(lesson.learner_minutes or 0 for lesson in lessons if lesson.track == track)
            for track in TRACKS}


def number_ranges(numbers: Sequence[str]) -> str:
    """``01-06 and 18`` for ``01 02 03 04 05 06 18``: lesson numbers as the README lists a track."""
    runs: list[list[str]] = []
    for number in numbers:
        if runs and int(number) == int(runs[-1][-1]) + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    parts = [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def format_hours(minutes: int) -> str:
    """``5 h 30 min``, as the README and the handout say a track's length."""
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest:02d} min" if hours else f"{rest} min"


def find_lessons(notebooks: Path | None = None) -> list[Lesson]:
    """Every ``NN_*.py`` lesson in ``notebooks`` (default: the course's), in course order.
    """
    return [read_lesson(path) for path in lesson_paths(notebooks)]


def add_lesson_arguments(parser: argparse.ArgumentParser) -> None:
    """``--lessons NN ...`` and ``--notebooks DIR``, as every tool that runs lessons takes them
    (``select_lessons`` reads the first, ``find_lessons`` the second)."""
    parser.add_argument("--lessons", nargs="+", default=(), metavar="NN",
                        help="only these lessons, by number (01 03) or file name")
    parser.add_argument("--notebooks", type=Path, default=None,
                        help="the lessons' folder (default: the checkout's notebooks/)")


def select_lessons(lessons: Sequence[Lesson], wanted: Sequence[str]) -> list[Lesson]:
    """The lessons named by number (``03``), stem or file name, in course order.
    """
    chosen = []
    for key in wanted:
        hits = [lesson for lesson in lessons
                if key in (lesson.number, lesson.name, lesson.path.name)]
        if not hits:
            valid = ", ".join(lesson.number for lesson in lessons)
            raise SystemExit(f"error: no lesson {key!r}; the lessons are {valid}")
        chosen += hits
    return [lesson for lesson in lessons if lesson in chosen]


def format_minutes(minutes: float | None) -> str:
    if minutes is None:
        return "not measured"
    return f"{minutes:.1f} min" if minutes >= 1 else f"{round(minutes * 60)} s"


def format_memory(lesson: Lesson, preset: str = MEMORY_PRESET) -> str:
    """The lesson's memory at ``preset`` as the README's table shows it."""
    mib = lesson.memory.get(preset)
    if mib is None:
        return "not measured"
    process = lesson.process_memory.get(preset)
    return f"{mib} MiB" + (f" + {process} MiB per DDP process" if process is not None else "")


def run_time_table(lessons: Sequence[Lesson]) -> str:
    """The README's Markdown table: each lesson's run time per preset and what it needs.
    """
    head = ["lesson", *(f"`{p}`" for p in TABLE_PRESETS), "needs"]
    head.insert(-1, f"memory at `{MEMORY_PRESET}`")  # course_tools.memory's column
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for lesson in lessons:
        times = [format_minutes(lesson.minutes.get(p)) for p in TABLE_PRESETS]
        times.append(format_memory(lesson))  # the memory column, before "needs"
        rows.append(f"| `{lesson.path.name}` | " + " | ".join(times) + f" | {lesson.needs} |")
    return "\n".join(rows) + "\n"


def _record(path: Path, key: str, preset: str, value: float | int) -> None:
    """Write ``amp_tutorial.<key>.<preset> = value`` into the lesson's header; the rest of the file
    is unchanged. The one writer of the headers."""
    notebook = jupytext.read(path)
    block = notebook.metadata.setdefault(METADATA_KEY, {})
    block.setdefault(key, {})[preset] = value
    jupytext.write(notebook, path, fmt="py:percent")


def record_learner_minutes(path: Path) -> int:
    """Write the lesson's learner minutes (``learner_time``) into its header; return them."""
    minutes = learner_time(path).minutes
    notebook = jupytext.read(path)
    notebook.metadata.setdefault(METADATA_KEY, {})["learner_minutes"] = minutes
    jupytext.write(notebook, path, fmt="py:percent")
    return minutes


def record_minutes(path: Path, preset: str, seconds: float) -> None:
    """Write a measured run time into the lesson's header (the rest of the file is unchanged).
    """
    _record(path, "minutes", preset, round(seconds / 60, 1))


def record_memory(path: Path, preset: str, mib: int, key: str = "memory") -> None:
    """Write a measured peak of live tensor memory, in MiB, into the lesson's header; ``key``
    ``process_memory`` for each process a lesson starts (``course_tools.memory``)."""
    if key not in ("memory", "process_memory"):
        raise ValueError(f"no memory figure {key!r} in a lesson's header")
    _record(path, key, preset, int(mib))


def imported_modules(path: Path, package: str = HELPER_PACKAGE) -> set[str]:
    """The modules of ``package`` that the Python file at ``path`` imports (``package.x`` -> x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names
                  if n.startswith(package + ".") and n.count(".") >= 1}
    return found


def helper_uses(lessons: Sequence[Lesson]) -> dict[str, list[str]]:
    """For each helper module some lesson imports, the numbers of the lessons that import it."""
    uses: dict[str, list[str]] = {}
    for lesson in lessons:
        for module in sorted(imported_modules(lesson.path)):
            uses.setdefault(module, []).append(lesson.number)
    return dict(sorted(uses.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_tools.catalogue",
                                     description="The lessons' metadata: the README's table, "
                                                 "or record a handout run's times.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("table", help="print the README's table of lessons and run times")
    commands.add_parser("uses", help="print which lessons import each amp_tutorial module")
    record = commands.add_parser("record", help="write a handout run's times into the headers")
    record.add_argument("timings", type=Path, help="timings.json from `pdm run handout`")
    people = commands.add_parser("learner-time", help="print each lesson's learner time and what "
                                 "it is made of; --record writes it into the headers")
    people.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    lessons = find_lessons()
    if args.command == "learner-time":
        for lesson in lessons:
            counted = learner_time(lesson.path)
            if args.record:
                record_learner_minutes(lesson.path)
            print(f"{lesson.name}: {counted.minutes} min ({lesson.track or 'no track'}; "
                  f"{counted.words} words, {counted.code_lines} code lines, "
                  f"{counted.exercises} exercises, {counted.quiz_questions} quiz questions)")
        lessons = find_lessons()
        for track, minutes in track_minutes(lessons).items():
            numbers = [lesson.number for lesson in lessons if lesson.track == track]
            print(f"{track} track: lessons {number_ranges(numbers)}, {format_hours(minutes)}")
        return 0
    if args.command == "table":
        print(run_time_table(lessons), end="")
        return 0
    if args.command == "uses":
        for module, numbers in helper_uses(lessons).items():
            print(f"{HELPER_PACKAGE}.{module}: lessons {', '.join(numbers)}")
        return 0
    timings = json.loads(args.timings.read_text())
    by_name = {lesson.name: lesson for lesson in lessons}
    for name, seconds in timings["seconds"].items():
        if name in timings.get("failed", {}):
            print(f"skipped {name}: it failed in that run")
            continue
        record_minutes(by_name[name].path, timings["preset"], seconds)
        print(f"{name}: {format_minutes(seconds / 60)} at {timings['preset']!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
