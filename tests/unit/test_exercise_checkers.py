"""What every graded exercise's checker does the same way, on the shared parts
(``amp_tutorial.exercises.checking``): learner code that raises, or never returns, gets one plain
message and no traceback from the checker. The per-exercise files test each checker's mistakes
and right spellings; this one runs the common cases over all of them."""

from __future__ import annotations

import runpy
from collections.abc import Callable

import pytest

from amp_tutorial.exercises import checking
from amp_tutorial.exercises.accumulation import check_train_accumulated
from amp_tutorial.exercises.autocast_settings import check_autocast_settings
from amp_tutorial.exercises.checking import CheckResult
from amp_tutorial.exercises.checkpoint_resume import check_save_and_load
from amp_tutorial.exercises.contrastive_loss import check_contrastive_loss
from amp_tutorial.exercises.fp16_step import check_fp16_step
from amp_tutorial.exercises.masked_attention import check_masked_attention
from amp_tutorial.exercises.train_loop import check_train_with_amp
from tests.support import SOLUTIONS

save_and_load = runpy.run_path(str(SOLUTIONS / "save_and_load.py"))

# exercise -> how its checker takes one learner function (checkpoint: as save, then as load)
CHECKS: dict[str, list[Callable[[Callable], CheckResult]]] = {
    "train_with_amp (06)": [check_train_with_amp],
    "autocast_settings (01)": [check_autocast_settings],
    "fp16_step (02)": [check_fp16_step],
    "train_accumulated (05)": [check_train_accumulated],
    "save_and_load (05)": [lambda fn: check_save_and_load(fn, save_and_load["load"]),
                           lambda fn: check_save_and_load(save_and_load["save"], fn)],
    "contrastive_loss (07)": [check_contrastive_loss],
    "masked_attention (13)": [check_masked_attention],
}


def test_every_exercise_module_is_checked_here() -> None:
    modules = {p.stem for p in (SOLUTIONS.parent / "src/amp_tutorial/exercises").glob("*.py")}
    assert len(modules - {"__init__", "checking", "training_spy"}) == len(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_a_crash_is_reported_not_raised(name: str) -> None:
    def broken(*args, **kwargs):
        raise ValueError("not done yet")

    for check in CHECKS[name]:
        result = check(broken)
        assert result.keys == {checking.RAISED}, str(result)
        assert "ValueError: not done yet" in str(result) and "Traceback" not in str(result)


@pytest.mark.parametrize("name", list(CHECKS))
def test_an_endless_loop_is_stopped_and_named(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checking, "TIME_LIMIT_S", 0.2)

    def endless(*args, **kwargs):
        while True:
            pass

    for check in CHECKS[name]:
        result = check(endless)
        assert result.keys == {checking.TIMED_OUT}, str(result)
        assert "still running after" in str(result) and "Traceback" not in str(result)
