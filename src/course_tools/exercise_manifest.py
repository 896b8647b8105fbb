"""The course's graded exercises and their mistake keys, written for the hub's progress service.

The workshop hub's `amp-progress` service (docker/hub/amp_progress) takes only attempts at the
course's own exercises, so that a learner cannot fill the instructor's page with made-up columns.
It learns them from a manifest, ``docker/hub/amp_progress/course.json``, that this module writes
from the course itself: every :class:`~amp_tutorial.exercises.checking.Exercise` declared in an
``amp_tutorial.exercises`` module, the quiz (found by running it), and every problem key a checker
can name (the modules' key constants, found in their source). The hub's image holds no torch, so
the file is generated here and committed; ``tests/unit/test_hub_progress.py`` fails when it is
not what this module writes now (after a checker gains a key, run
``python -m course_tools.exercise_manifest`` and commit the file).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path
from unittest import mock

import amp_tutorial.exercises
from amp_tutorial import quiz
from amp_tutorial.exercises.checking import Exercise

MANIFEST = Path(__file__).resolve().parents[2] / "docker/hub/amp_progress/course.json"
KEY = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
PROBLEM_CALLS = {"Problem", "named"}  # Problem(KEY, ...) and Problem.named(KEY, ...)


def exercise_modules() -> list:
    """Every module of the amp_tutorial.exercises package, imported."""
    package = amp_tutorial.exercises
    return [importlib.import_module(f"{package.__name__}.{info.name}")
            for info in pkgutil.iter_modules(package.__path__)]


def module_keys(module) -> set[str]:
    """The problem keys a checker module defines: its module-level constants whose value is a
    kebab-case name, either hyphenated or passed straight to ``Problem``/``Problem.named``
    (``DEVICE_TYPE = "cpu"`` is neither)."""
    tree = ast.parse(inspect.getsource(module))
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str) and KEY.fullmatch(node.value.value)
    }
    passed = {
        node.args[0].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) in PROBLEM_CALLS
    }
    return {value for name, value in constants.items() if "-" in value or name in passed}


def quiz_attempts() -> list[tuple[str, str, list[str]]]:
    """(lesson, exercise, keys) of the quiz's attempts, all unanswered and all wrong: run, with
    the recording caught, so that the quiz's own code names its exercise and keys."""
    seen: list[tuple[str, str, list[str]]] = []

    def caught(lesson, exercise, passed, keys, message):
        seen.append((str(lesson), str(exercise), sorted(keys)))

    with mock.patch.object(quiz, "record_attempt", caught):
        quiz.check_quiz({})
        quiz.check_quiz(dict.fromkeys(quiz.QUESTIONS, "not-an-option"))
    return seen


def manifest() -> dict:
    """The exercises (lesson, name) and the keys, sorted."""
    modules = exercise_modules()
    exercises = {(e.lesson, e.name) for m in modules for e in vars(m).values()
                 if isinstance(e, Exercise)}
    keys = set().union(*(module_keys(m) for m in modules))
    for lesson, exercise, quiz_keys in quiz_attempts():
        exercises.add((lesson, exercise))
        keys.update(quiz_keys)
    return {
        "generated_by": "python -m course_tools.exercise_manifest (do not edit by hand)",
        "exercises": [list(e) for e in sorted(exercises)],
        "keys": sorted(keys),
    }


def text() -> str:
    """The manifest as JSON, one exercise or key a line (reviewable in a diff)."""
    data = manifest()
    rows = {name: ",\n".join(f"  {json.dumps(v)}" for v in data[name])
            for name in ("exercises", "keys")}
    return (f'{{"generated_by": {json.dumps(data["generated_by"])},\n'
            f' "exercises": [\n{rows["exercises"]}\n ],\n "keys": [\n{rows["keys"]}\n ]}}\n')


def main(argv: list[str] | None = None) -> int:
    """Write the manifest; with --check, exit 1 when the committed one differs."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        fresh = MANIFEST.read_text(encoding="utf-8") == text()
        print(f"{MANIFEST}: {'up to date' if fresh else 'stale: run without --check'}")
        return 0 if fresh else 1
    MANIFEST.write_text(text(), encoding="utf-8")
    print(f"wrote {MANIFEST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
