"""What the test tiers share: the project's folders, the rule for a missing tool, and a loader for
the programs in ``scripts/`` (files run top to bottom, not modules of a package).

Other shared helpers: ``tests.support.notebook_page`` (what a notebook page shows per code cell, in
the lab and in the handout), ``tests.support.lab_server`` (a throwaway JupyterLab and its REST
client), ``tests.support.docker_env`` (Docker plumbing and the test base image).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "src" / "amp_tutorial" / "exercises" / "solutions"
SCRIPTS = ROOT / "scripts"
IN_CI = os.environ.get("CI") == "true"


def missing_tool(reason: str, fix: str) -> NoReturn:
    """Skip a test whose tool is missing on a developer's machine; fail it under ``CI=true``.

    CI installs every tool the suite needs (``.ci/run``), so there a missing one is a bug.
    """
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this test must run; .ci/run installs what it needs)")
    pytest.skip(f"{reason}; {fix}")


def runnable_lesson() -> Path:
    """The first lesson that runs to the end as a learner gets it: one without an exercise, whose
    stub raises until the learner writes the answer (the test run swaps the answers in; a plain
    ``jupytext --execute`` in a container does not)."""
    import jupytext

    from course_tools.answers import is_exercise
    from course_tools.catalogue import lesson_paths

    return next(path for path in lesson_paths(NOTEBOOKS)
                if not any(map(is_exercise, jupytext.read(path).cells)))


def load_program(name: str) -> ModuleType:
    """``scripts/NAME.py`` imported as module ``NAME`` (its ``__main__`` block does not run)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader, f"no program scripts/{name}.py"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def read_only(folder: Path) -> Callable[[], None]:
    """Make ``folder`` read-only as a volume mounted ``:ro`` is; return the undo. Root ignores
    file modes, so root gets a read-only bind mount; others get modes."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    mount = shutil.which("mount")
    if not mount or subprocess.run([mount, "--bind", folder, folder]).returncode:
        pytest.skip("root without mount(8) rights: cannot make a read-only folder here")
    subprocess.run([mount, "-o", "remount,bind,ro", folder, folder], check=True)
    return lambda: subprocess.run(["umount", folder], check=True)
