"""What several test files need: the project's folders and the rule for a missing tool.

The nbval collection of the lessons lives in the root ``conftest.py``; the end-to-end helpers
(a throwaway JupyterLab, its REST client) live in ``tests/lab_server.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "solutions"
IN_CI = os.environ.get("CI") == "true"


def missing_tool(reason: str, fix: str) -> NoReturn:
    """Skip a test whose tool is missing on a developer's machine; fail it under ``CI=true``.

    CI installs every tool the suite needs (``.ci/run``), so there a missing one is a bug.
    """
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this test must run; .ci/run installs what it needs)")
    pytest.skip(f"{reason}; {fix}")
