"""What every graded exercise's checker does the same way, on the shared parts
(``amp_tutorial.exercises.checking``): learner code that raises, or never returns, gets one plain
message and no traceback from the checker. The per-exercise files test each checker's mistakes
and right spellings; this one runs the common cases over all of them."""

from __future__ import annotations

import runpy
from collections.abc import Callable

import pytest
import torch

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
    modules = {p.stem for p in SOLUTIONS.parent.glob("*.py")}
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
def test_a_stub_is_named_as_not_written_yet_after_one_scenario(name: str) -> None:
    """issue 61: the lesson's stub raised in every scenario, so a check of it took about 70 s
    and said "raised NotImplementedError" once per scenario."""
    calls = []

    def stub(*args, **kwargs):
        calls.append(1)
        raise NotImplementedError("your code here")

    for check in CHECKS[name]:
        calls.clear()
        result = check(stub)
        assert result.keys == {checking.UNFINISHED}, str(result)
        assert "is not written yet" in str(result) and "your code here" in str(result)
        assert len(calls) == 1, (name, len(calls))  # stopped at the first scenario


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


# -- what a call leaves behind (checking.left_behind), one rule for every checker ------------------
def _solution(file: str, name: str) -> Callable[..., object]:
    return runpy.run_path(str(SOLUTIONS / file))[name]


# exercise -> (its checker of one function, the reference function, where its model, list and
# tensor arguments are: positions in the call, None where the exercise has none)
REFERENCES: dict[str, tuple[Callable[[Callable], CheckResult], Callable[..., object],
                            int | None, int | None, int | None]] = {
    "train_with_amp (06)": (check_train_with_amp,
                            _solution("train_with_amp.py", "train_with_amp"), 0, 1, None),
    "autocast_settings (01)": (check_autocast_settings,
                               _solution("autocast_settings.py", "autocast_settings"),
                               None, None, None),
    "fp16_step (02)": (check_fp16_step, _solution("fp16_step.py", "fp16_step"), 0, None, 3),
    "train_accumulated (05)": (check_train_accumulated,
                               _solution("train_accumulated.py", "train_accumulated"), 0, 3,
                               None),
    "save (05)": (CHECKS["save_and_load (05)"][0], save_and_load["save"], 1, None, None),
    "load (05)": (CHECKS["save_and_load (05)"][1], save_and_load["load"], 1, None, None),
    "contrastive_loss (07)": (check_contrastive_loss,
                              _solution("contrastive_loss.py", "contrastive_loss"), None, None,
                              0),
    "masked_attention (13)": (check_masked_attention,
                              _solution("masked_attention.py", "masked_attention"), None, None,
                              0),
}
# each mistake: (what the right answer does after its work, the key; which argument it needs)
GLOBAL_EFFECTS = {
    "autocast switched on for cuda": (lambda args, at: torch.set_autocast_enabled("cuda", True),
                                      checking.AUTOCAST_LEFT_CHANGED),
    "default dtype set to float64": (lambda args, at: torch.set_default_dtype(torch.float64),
                                     checking.DEFAULT_DTYPE_LEFT_CHANGED),
    "grad mode switched off": (lambda args, at: torch.set_grad_enabled(False),
                               checking.GRAD_MODE_LEFT_CHANGED),
    "TF32 and medium matmul precision": (lambda args, at: _tf32_and_medium(),
                                         checking.SETTING_LEFT_CHANGED),
}
# the other global settings, each by one checker (the cheapest to run): one rule for all of them
SETTINGS = {
    "default device set to meta": lambda: torch.set_default_device("meta"),
    "SDPA's reduced-precision math flag": (
        lambda: torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)),
    "flash attention switched off": lambda: torch.backends.cuda.enable_flash_sdp(False),
    "anomaly mode left on": lambda: torch.autograd.set_detect_anomaly(True),
    "deterministic algorithms": lambda: torch.use_deterministic_algorithms(True),
    "cuDNN benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", True),
    "one CPU thread": lambda: torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2),
    "subnormals flushed to zero": lambda: torch.set_flush_denormal(True),
    "fp16 accumulation in fp16 matmuls": (
        lambda: setattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", True)),
}


def _tf32_and_medium() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")  # bf16 matmuls on a CPU too (oneDNN)
MODEL_EFFECTS = {
    "model left in eval mode": (lambda args, at: args[at].eval(), checking.MODEL_MODE_CHANGED),
    "model cast to float16": (lambda args, at: args[at].half(), checking.MODEL_DTYPE_CHANGED),
}
LIST_EFFECTS = {"caller's list popped": (lambda args, at: args[at].pop(),
                                         checking.CALLER_LIST_CHANGED),
                "a tensor in the caller's list doubled in place": (
                    lambda args, at: args[at][0][0].mul_(2), checking.INPUT_CHANGED)}
TENSOR_EFFECTS = {"an input doubled in place": (lambda args, at: args[at].detach().mul_(2),
                                                checking.INPUT_CHANGED)}


def _state_cases() -> list:
    cases = []
    for exercise, (_, _, model_at, list_at, tensor_at) in REFERENCES.items():
        for effects, at in ((GLOBAL_EFFECTS, None), (MODEL_EFFECTS, model_at),
                            (LIST_EFFECTS, list_at), (TENSOR_EFFECTS, tensor_at)):
            if effects is not GLOBAL_EFFECTS and at is None:
                continue
            if exercise in ("fp16_step (02)", "load (05)") and effects is MODEL_EFFECTS:
                effects = {k: v for k, v in effects.items() if "float16" not in k}  # it raises
            for what, (effect, key) in effects.items():
                cases.append(pytest.param(exercise, effect, at, key, id=f"{exercise}: {what}"))
    return cases


@pytest.mark.parametrize(("exercise", "effect", "at", "key"), _state_cases())
def test_what_a_call_leaves_behind_is_named(exercise: str, effect, at, key: str) -> None:
    check, reference, *_ = REFERENCES[exercise]

    def leaves_something(*args, **kwargs):
        value = reference(*args, **kwargs)
        effect(args, at)
        return value

    state = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.is_autocast_enabled("cuda"))
    result = check(leaves_something)
    assert result.keys == {key}, str(result)
    assert "Traceback" not in str(result)
    # and the checker put the global state back
    assert (torch.get_default_dtype(), torch.is_grad_enabled(),
            torch.is_autocast_enabled("cuda")) == state


@pytest.mark.parametrize("exercise", list(REFERENCES))
def test_every_reference_solution_passes(exercise: str) -> None:
    check, reference, *_ = REFERENCES[exercise]
    result = check(reference)
    assert result.passed, str(result)


def _settings_now() -> dict:
    return checking._read_settings()


@pytest.mark.parametrize("what", list(SETTINGS))
def test_every_global_setting_left_changed_is_named_and_put_back(what: str) -> None:
    check, reference, *_ = REFERENCES["fp16_step (02)"]

    def leaves_it(*args, **kwargs):
        value = reference(*args, **kwargs)
        SETTINGS[what]()
        return value

    before = _settings_now()
    result = check(leaves_it)
    assert result.keys == {checking.SETTING_LEFT_CHANGED}, str(result)
    assert _settings_now() == before


def test_an_autocast_entered_and_never_exited_is_one_mistake() -> None:
    check, reference, *_ = REFERENCES["fp16_step (02)"]

    def enters(*args, **kwargs):
        value = reference(*args, **kwargs)
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
        return value

    result = check(enters)
    assert result.keys == {checking.AUTOCAST_LEFT_CHANGED}, str(result)
    assert not torch.is_autocast_enabled("cpu") and _settings_now() == checking._read_settings()
