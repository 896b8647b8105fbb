"""Every public function and class of the package says which lessons use it (CONTRIBUTING.md).

A tool module no lesson imports (the handout, the lessons' catalogue, the exercise swapping) says
so once, in its module docstring ("Used in no lesson: ..."), and a test checks that it is true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "amp_tutorial"
TOOL_MODULE = re.compile(r"^Used in no lesson:", re.MULTILINE)


def _tool_modules() -> list[str]:
    return [module.stem for module in sorted(PACKAGE.glob("*.py"))
            if TOOL_MODULE.search(ast.get_docstring(ast.parse(module.read_text())) or "")]
USED_IN = re.compile(r"^Used in (lessons? \d\d|every lesson|no lesson)", re.MULTILINE)


def _public_definitions() -> list[tuple[str, str, str | None]]:
    found = []
    for module in sorted(PACKAGE.glob("*.py")):
        if module.stem in _tool_modules():
            continue
        for node in ast.parse(module.read_text()).body:
            if (isinstance(node, ast.FunctionDef | ast.ClassDef)
                    and not node.name.startswith("_")):
                found.append((module.stem, node.name, ast.get_docstring(node)))
    return found


def test_the_package_has_public_definitions_to_check() -> None:
    names = {f"{module}.{name}" for module, name, _ in _public_definitions()}
    assert {"measure.StepTimer", "checkpoint.parameter_hash", "ddp.train"} <= names


@pytest.mark.parametrize(("module", "name", "doc"), [
    pytest.param(*found, id=f"{found[0]}.{found[1]}") for found in _public_definitions()])
def test_docstring_names_the_lessons_that_use_it(module: str, name: str, doc: str | None) -> None:
    assert doc is not None, f"{module}.{name} has no docstring"
    assert USED_IN.search(doc), f"{module}.{name}: no 'Used in lesson(s) NN' line in its docstring"


def test_tool_modules_are_used_by_no_lesson() -> None:
    tools = _tool_modules()
    assert {"handout", "lessons", "solutions"} <= set(tools)
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        imported = set(re.findall(r"amp_tutorial\.(\w+)", lesson.read_text()))
        assert not imported & set(tools), f"{lesson.name} imports {imported & set(tools)}"
