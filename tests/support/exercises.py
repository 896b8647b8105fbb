"""What the tests of every graded exercise's checker assert the same way."""

from __future__ import annotations

from types import ModuleType

from amp_tutorial.exercises.checking import RAISED, CheckResult


def assert_names(result: CheckResult, key: str, also_raises: bool = False) -> None:
    """The checker rejected the answer for ``key`` and nothing else (RAISED may come with it when
    the mistake makes torch raise), each problem with a message."""
    assert not result.passed
    expected = {key, RAISED} if also_raises else {key}
    assert result.keys <= expected and key in result.keys, str(result)
    assert all(p.message for p in result.problems)


def problem_keys(module: ModuleType, *not_keys: str) -> set[str]:
    """The problem keys an exercise module defines: its UPPER_CASE string constants, less
    ``not_keys`` (settings such as a device type or the praise text)."""
    return {value for name, value in vars(module).items()
            if name.isupper() and isinstance(value, str) and value not in not_keys}
