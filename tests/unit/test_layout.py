"""The house by who lives in it: what lessons import (``src/amp_tutorial``), the course's own tools
(``src/course_tools``) and the programs people run (``scripts/``). Imports point one way: lessons,
tools and programs use the helpers; the helpers use none of them, and lessons use no tool or
program. Read from the files' import statements, so a new module is checked without listing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from course_tools.catalogue import HELPER_PACKAGE, find_lessons, helper_uses, lesson_paths
from tests.support import NOTEBOOKS, ROOT, SCRIPTS

HELPERS = ROOT / "src" / HELPER_PACKAGE
TOOLS = ROOT / "src" / "course_tools"
PROGRAMS = {path.stem for path in SCRIPTS.glob("*.py")}


def top_level_imports(path: Path) -> set[str]:
    """The first component of every module ``path`` imports (``a.b.c`` -> ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found


def test_the_three_residents_are_where_the_layout_says() -> None:
    assert {"device", "measure"} <= {p.stem for p in HELPERS.glob("*.py")}
    assert {"checking", "training_spy", "train_loop"} <= {
        p.stem for p in (HELPERS / "exercises").glob("*.py")}
    assert {"catalogue", "handout", "lab", "answers"} <= {p.stem for p in TOOLS.glob("*.py")}
    assert {"bench", "train_ddp"} <= PROGRAMS


@pytest.mark.parametrize("path", sorted(HELPERS.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(HELPERS)))
def test_helpers_import_no_tool_program_or_test(path: Path) -> None:
    wrong = top_level_imports(path) & {"course_tools", "tests", *PROGRAMS}
    assert not wrong, f"{path.name} imports {wrong}: helpers must not depend on tools or programs"


@pytest.mark.parametrize("path", [*lesson_paths(NOTEBOOKS), NOTEBOOKS / "_template.py"],
                         ids=lambda p: p.name)
def test_lessons_import_only_the_helpers_of_this_project(path: Path) -> None:
    wrong = top_level_imports(path) & {"course_tools", "tests", *PROGRAMS}
    assert not wrong, f"{path.name} imports {wrong}: a lesson imports only from amp_tutorial"


@pytest.mark.parametrize("path", [*sorted(TOOLS.glob("*.py")), *sorted(SCRIPTS.glob("*.py"))],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_tools_and_programs_do_not_import_each_other_or_the_tests(path: Path) -> None:
    others = {"tests", *PROGRAMS} if path.parent == TOOLS else {"tests", "course_tools"}
    wrong = top_level_imports(path) & others
    assert not wrong, f"{path.name} imports {wrong}"


def test_no_docstring_keeps_a_hand_made_list_of_lessons() -> None:
    """Which lesson uses which helper is printed from the imports
    (``python -m course_tools.catalogue uses``), never typed into docstrings."""
    for path in [*HELPERS.rglob("*.py"), *TOOLS.glob("*.py"), *SCRIPTS.glob("*.py")]:
        for line in path.read_text(encoding="utf-8").splitlines():
            assert not line.strip().startswith(("Used in lesson", "Used in every lesson",
                                                "Used in no lesson")), f"{path.name}: {line}"


def test_the_uses_list_comes_from_the_lessons_imports() -> None:
    lessons = find_lessons(NOTEBOOKS)
    uses = helper_uses(lessons)
    assert uses["device"] == [lesson.number for lesson in lessons]  # every lesson picks a device
    assert "06" in uses["exercises"]  # the graded exercise's checker
    assert "autocast_policy" in uses and "bench" not in uses


def test_the_wheel_ships_every_package_of_src() -> None:
    """pdm-backend packs only the packages ``[tool.pdm.build] includes`` names; the image installs
    the wheel, so a package missing there (course_tools once was) breaks the container's start."""
    import tomllib

    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pdm"]["build"]
    packages = {f"src/{path.parent.name}" for path in (ROOT / "src").glob("*/__init__.py")}
    assert (ROOT / "src/amp_tutorial/exercises/__init__.py").is_file()  # a subpackage: included
    assert packages == {"src/amp_tutorial", "src/course_tools"}
    assert set(includes["includes"]) == packages
