"""check_autocast_settings: every listed mistake is named, every correct spelling passes, and the
facts its messages state hold for the installed torch.

``settings()`` builds the reference answer; each wrong case changes exactly one thing in it, so the
checker must report that mistake's key and nothing else. The right spellings are written out by
hand, each differently (an if/elif chain, a dict of rules, ``getattr(torch, device.type)``,
``match``, the compute capability). The checker runs the reference answer beside the learner's on
the course's devices and on drawn ones (issue 44): an answer equal to the reference's passes.
"""

from __future__ import annotations

import inspect
import runpy
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import NamedTuple
from unittest import mock

import numpy as np
import pytest
import torch

from amp_tutorial.exercises import autocast_settings as exercise
from amp_tutorial.exercises import checking
from amp_tutorial.exercises.autocast_settings import (
    ALL_SCENARIOS,
    DRAWN,
    SCENARIOS,
    SIMULATED,
    autocast_reaction,
    check_autocast_settings,
    expected_settings,
    simulate,
)
from tests.support import SOLUTIONS
from tests.support.exercises import answers, checker_tests, problem_keys

reference_solution = runpy.run_path(str(SOLUTIONS / "autocast_settings.py"))["autocast_settings"]
FP16, BF16 = torch.float16, torch.bfloat16


# -- the answer builder ----------------------------------------------------------------------------
def native_bf16(device: torch.device) -> bool:
    """What the reference asks on a GPU: native bf16, emulation not counted."""
    module = torch.cuda if device.type == "cuda" else torch.xpu
    return module.is_bf16_supported(including_emulation=False)


def settings(
    *,
    device_type: Callable[[torch.device], object] = lambda d: d.type,
    native: Callable[[torch.device], bool] = native_bf16,  # asked for cuda and xpu only
    cpu_dtype: object = BF16,
    mps_dtype: object = FP16,
    scaler: Callable[[torch.device, object], object] = lambda d, dtype: dtype == FP16,
    pack: Callable[[object, object, object], object] = lambda t, dtype, s: (t, dtype, s),
) -> Callable[[torch.device], object]:
    """An ``autocast_settings`` doing the reference's steps, changed as the options say."""
    def autocast_settings(device: torch.device) -> object:
        if device.type == "cpu":
            dtype = cpu_dtype
        elif device.type == "mps":
            dtype = mps_dtype
        else:
            dtype = BF16 if native(device) else FP16
        return pack(device_type(device), dtype, scaler(device, dtype))

    return autocast_settings


def test_builder_defaults_are_the_reference() -> None:
    """And the reference follows the course's rule on every device, drawn ones too."""
    for scenario in ALL_SCENARIOS:
        with ExitStack() as stack:
            simulate(scenario, stack)
            answers = {reference_solution(scenario.device), settings()(scenario.device)}
        assert answers == {expected_settings(scenario)}, scenario.name


# -- one mistake each ------------------------------------------------------------------------------
def as_dict(t: object, dtype: object, s: object) -> object:
    return {"device_type": t, "dtype": dtype, "use_scaler": s}


MISTAKES = [
    ("hard-coded cuda", settings(device_type=lambda d: "cuda"), exercise.DEVICE_TYPE_HARD_CODED),
    ("str(device): cuda:0 with its index", settings(device_type=str),
     exercise.DEVICE_TYPE_WITH_INDEX),
    ("type and index spelled out", settings(device_type=lambda d: f"{d.type}:{d.index or 0}"),
     exercise.DEVICE_TYPE_WITH_INDEX),
    ("the torch.device itself", settings(device_type=lambda d: d), exercise.DEVICE_TYPE_NOT_STR),
    ("'gpu' for every accelerator",
     settings(device_type=lambda d: "cpu" if d.type == "cpu" else "gpu"),
     exercise.DEVICE_TYPE_UNKNOWN),
    ("the type of whatever is available",
     settings(device_type=lambda d: "cuda" if torch.cuda.is_available() else "cpu"),
     exercise.DEVICE_TYPE_OTHER_DEVICE),
    ("the accelerator's type whenever one is available",  # issue 28: right on every GPU
     settings(device_type=lambda d: "cuda" if torch.cuda.is_available() else "mps"
              if torch.backends.mps.is_available() else d.type),
     exercise.DEVICE_TYPE_OTHER_DEVICE),
    ("bf16 with emulation counted (no including_emulation=False)",
     settings(native=lambda d: getattr(torch, d.type).is_bf16_supported()),
     exercise.BF16_EMULATED),
    ("fp16 on every GPU", settings(native=lambda d: False), exercise.BF16_NATIVE_IGNORED),
    ("fp16 on the CPU", settings(cpu_dtype=FP16), exercise.FP16_ON_CPU),
    ("bf16 on MPS", settings(mps_dtype=BF16), exercise.BF16_ON_MPS),
    ("fp32 on the CPU", settings(cpu_dtype=torch.float32), exercise.DTYPE_NOT_16_BIT),
    ("dtype as a string",
     settings(pack=lambda t, dtype, s: (t, str(dtype).removeprefix("torch."), s)),
     exercise.DTYPE_NOT_TORCH_DTYPE),
    ("no scaler with fp16", settings(scaler=lambda d, dtype: False),
     exercise.NO_SCALER_WITH_FP16),
    ("a scaler always", settings(scaler=lambda d, dtype: True), exercise.SCALER_WITH_BF16),
    ("a scaler on every GPU", settings(scaler=lambda d, dtype: d.type != "cpu"),
     exercise.SCALER_WITH_BF16),
    ("a GradScaler object, not a bool",
     settings(scaler=lambda d, dtype: torch.amp.GradScaler(d.type, enabled=dtype == FP16)),
     exercise.SCALER_NOT_BOOL),
    ("use_scaler left out as None", settings(scaler=lambda d, dtype: None),
     exercise.SCALER_NOT_BOOL),
    ("dtype first", settings(pack=lambda t, dtype, s: (dtype, t, s)), exercise.WRONG_ORDER),
    ("use_scaler first", settings(pack=lambda t, dtype, s: (s, t, dtype)), exercise.WRONG_ORDER),
    ("two values, no use_scaler", settings(pack=lambda t, dtype, s: (t, dtype)),
     checking.WRONG_RETURN),
    ("a dict", settings(pack=as_dict), checking.WRONG_RETURN),
    ("returns None", settings(pack=lambda t, dtype, s: None), checking.WRONG_RETURN),
]
WRONG = answers(MISTAKES)


def test_a_wrong_type_is_a_plain_message() -> None:
    text = str(check_autocast_settings(WRONG["returns None"]))
    assert "returned NoneType (None) where a tuple (device_type, dtype, use_scaler)" in text
    assert "Traceback" not in text


def saved_torch_state() -> list[object]:
    functions = [getattr(owner, name) for owner, name in SIMULATED]
    autocast = [(torch.is_autocast_enabled(t), torch.get_autocast_dtype(t))
                for t in exercise.DEVICE_TYPES]
    return [*functions, torch.version.hip, *autocast]


@pytest.mark.parametrize("case",
                         ["dtype as a string", "hard-coded cuda", "the torch.device itself"])
def test_checker_leaves_torch_as_it_was(case: str) -> None:
    """A string dtype makes autocast's __enter__ raise after it switched autocast on: restored."""
    before = saved_torch_state()
    check_autocast_settings(WRONG[case])
    check_autocast_settings(lambda device: 1 / 0)
    assert saved_torch_state() == before


# -- correct spellings -----------------------------------------------------------------------------
NATIVE_BF16 = {  # a dict of per-type rules, asked when called
    "cpu": lambda: True,
    "cuda": lambda: torch.cuda.is_bf16_supported(including_emulation=False),
    "xpu": lambda: torch.xpu.is_bf16_supported(including_emulation=False),
    "mps": lambda: False,
}


def with_rules(device):
    dtype = torch.bfloat16 if NATIVE_BF16[device.type]() else torch.float16
    return device.type, dtype, dtype is torch.float16


def with_getattr(device):
    kind = device.type
    if kind in ("cuda", "xpu"):
        native = getattr(torch, kind).is_bf16_supported(including_emulation=False)
    else:
        native = kind == "cpu"
    return kind, torch.bfloat16 if native else torch.float16, not native


def with_match(device):
    match device.type:
        case "cpu":
            dtype = torch.bfloat16
        case "cuda" if torch.cuda.is_bf16_supported(including_emulation=False):
            dtype = torch.bfloat16
        case "xpu" if torch.xpu.is_bf16_supported(including_emulation=False):
            dtype = torch.bfloat16
        case _:
            dtype = torch.float16
    return (device.type, dtype, dtype == torch.float16)


class AmpSettings(NamedTuple):
    device_type: str
    dtype: torch.dtype
    use_scaler: bool


def with_capability(device):
    """NVIDIA's native bf16 read off the compute capability, as the argument does; a NamedTuple."""
    if device.type == "cuda":
        native = torch.cuda.get_device_capability(device)[0] >= 8
    elif device.type == "xpu":
        native = torch.xpu.is_bf16_supported(including_emulation=False)
    else:
        native = device.type == "cpu"
    dtype = torch.bfloat16 if native else torch.float16
    return AmpSettings(device.type, dtype, use_scaler=not native)


DTYPES = {True: (torch.bfloat16, False), False: (torch.float16, True)}  # native -> settings


def with_table(device):
    """Native bf16 from the capability tuple (NVIDIA) and a table of results."""
    kind = device.type
    if kind == "cuda":
        native = torch.cuda.get_device_capability(device) >= (8, 0)
    elif kind == "xpu":
        native = torch.xpu.is_bf16_supported(including_emulation=False)
    else:
        native = {"cpu": True, "mps": False}[kind]
    return (kind, *DTYPES[native])


CORRECT = {
    "reference solution: an if/elif chain": reference_solution,
    "a dict of per-type rules": with_rules,
    "getattr(torch, device.type).is_bf16_supported": with_getattr,
    "match device.type": with_match,
    "compute capability, a NamedTuple": with_capability,
    "a list instead of a tuple": settings(pack=lambda t, dtype, s: [t, dtype, s]),
    "use_scaler as a numpy bool": settings(scaler=lambda d, dtype: np.bool_(dtype == FP16)),
    "the capability compared as a tuple, a dtype table": with_table,
}


test_each_mistake_is_named, test_every_problem_key_has_a_case, test_correct_answers_pass = (
    checker_tests(check_autocast_settings, MISTAKES,
                  problem_keys(exercise, exercise.PRAISE),
                  CORRECT, exercise.PRAISE))


def test_a_right_answer_this_torch_refuses_still_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older torch may refuse a device type it was not built for: not the learner's fault."""
    real = torch.autocast

    def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "mps":
            raise RuntimeError("User specified an unsupported autocast device_type 'mps'")
        return real(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    monkeypatch.setattr(torch, "autocast", autocast)
    result = check_autocast_settings(reference_solution)
    assert result.passed and str(result) != exercise.PRAISE
    assert "[mps] torch.autocast(device_type='mps', dtype=torch.float16) raised RuntimeError: " \
           "User specified an unsupported autocast device_type 'mps'." in str(result)


# -- what the messages say, checked on the installed torch ----------------------------------------
def test_every_reference_answer_is_taken_by_autocast() -> None:
    for scenario in ALL_SCENARIOS:
        with ExitStack() as stack:
            simulate(scenario, stack)
            device_type, dtype, _ = expected_settings(scenario)
            reaction = autocast_reaction(device_type, dtype, scenario.device)
        assert reaction.accepted, f"{scenario.name}: {reaction}"
        assert reaction.matmul_dtype == (BF16 if scenario.device.type == "cpu" else None)


def parameters(fn: Callable[..., object]) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_fakes_answer_as_torch_does() -> None:
    """Same signatures as torch's; torch's source has the rules the fakes copy."""
    for owner, name in SIMULATED:
        with ExitStack() as stack:
            simulate(SCENARIOS[0], stack)
            fake = getattr(owner, name)
        assert parameters(fake) == parameters(getattr(owner, name)), name
    cuda, xpu = (inspect.getsource(m.is_bf16_supported) for m in (torch.cuda, torch.xpu))
    assert "major >= 8" in cuda and "if not including_emulation" in cuda
    assert "including_emulation\n        or torch.xpu.get_device_properties()" \
           ".has_bfloat16_conversions" in xpu
    t4, ampere = SCENARIOS[2], SCENARIOS[1]
    for scenario, emulated, native in ((t4, True, False), (ampere, True, True)):
        with ExitStack() as stack:
            simulate(scenario, stack)
            assert torch.cuda.is_bf16_supported() is emulated
            assert torch.cuda.is_bf16_supported(including_emulation=False) is native


def quiet_autocast(device_type: str, dtype: torch.dtype) -> tuple[bool, list[str]]:
    """Whether ``torch.autocast`` stays on, and what it warned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        context = torch.autocast(device_type=device_type, dtype=dtype)
    return context._enabled, [str(w.message) for w in caught]


def test_an_index_is_dropped_and_skips_the_cuda_checks() -> None:
    """DEVICE_TYPE_WITH_INDEX's message: one switch per type; "cuda:0" skips the "cuda" checks."""
    with torch.autocast("cuda:1", dtype=FP16):
        assert torch.is_autocast_enabled("cuda")
    with mock.patch.object(torch.cuda, "is_available", lambda: False):
        assert quiet_autocast("cuda", FP16) == (False, [
            "CUDA is not available or torch_xla is imported. Disabling autocast."])
        assert quiet_autocast("cuda:0", FP16) == (True, [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert not torch.amp.GradScaler("cuda").is_enabled()
        assert torch.amp.GradScaler("cuda:0").is_enabled()
    with (mock.patch.object(torch.cuda, "is_available", lambda: True),
          mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **k: False)):
        with pytest.raises(RuntimeError, match="does not support bfloat16"):
            torch.autocast("cuda", dtype=BF16)
        assert quiet_autocast("cuda:0", BF16) == (True, [])


def test_autocast_changes_only_ops_on_its_own_device_type() -> None:
    """The hard-coded and other-device messages: autocast on for CUDA leaves a CPU matmul alone.
    (The other way round, CPU autocast and a fake CUDA tensor, holds too but costs ~10 s here.)"""
    with torch.autocast("cuda:0", dtype=FP16):  # on, even where CUDA is absent: see above
        assert torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32  # a CPU matmul


def test_messages_quote_what_autocast_did() -> None:
    text = str(check_autocast_settings(WRONG["hard-coded cuda"]))
    assert "CUDA is not available or torch_xla is imported. Disabling autocast." in text
    assert "inside it ran in torch.float32" in text
    text = str(check_autocast_settings(WRONG["the torch.device itself"]))
    assert "Expected `device_type` of type `str`" in text
    text = str(check_autocast_settings(WRONG["dtype as a string"]))
    assert "must be torch.dtype, not str" in text
    text = str(check_autocast_settings(WRONG["fp32 on the CPU"]))
    assert "In CPU autocast, but the target dtype is not supported. Disabling autocast." in text
    text = str(check_autocast_settings(WRONG["bf16 with emulation counted (no "
                                             "including_emulation=False)"]))
    assert "torch.autocast(device_type='cuda', dtype=torch.bfloat16) took it without a warning" \
        in text and "[cuda:0 (T4); xpu:0 (bf16 emulated); cuda:1 (sm 70)" in text


def test_other_facts_the_messages_state() -> None:
    assert torch.get_autocast_dtype("cpu") == BF16  # FP16_ON_CPU: CPU autocast's default
    assert not hasattr(torch.mps, "is_bf16_supported")  # BF16_ON_MPS
    fp16, bf16, fp32 = (torch.finfo(d) for d in (FP16, BF16, torch.float32))
    assert fp16.smallest_normal * fp16.eps == 2.0**-24  # NO_SCALER_WITH_FP16
    assert bf16.max > 3e38 and bf16.smallest_normal == fp32.smallest_normal  # fp32's exponent
    step = inspect.getsource(torch.amp.GradScaler._maybe_opt_step)  # SCALER_WITH_BF16
    assert ".item()" in step and "found_inf_per_device" in step
    scaler = torch.amp.GradScaler("cpu", enabled=torch.amp.GradScaler("cpu", enabled=False))
    assert scaler.is_enabled()  # SCALER_NOT_BOOL: a GradScaler passed as enabled= counts as True


# -- the reference beside the learner's, on drawn devices (issue 44) ------------------------------
def test_the_drawn_devices_exercise_every_rule() -> None:
    """Native bf16 and only emulated on NVIDIA GPUs of other capabilities, indices other than 0,
    a device given without an index, an XPU, and a CPU beside an accelerator."""
    cuda = [s for s in DRAWN if s.device.type == "cuda"]
    assert {s.native_bf16 for s in cuda} == {True, False}
    assert {s.cuda_capability for s in cuda}.isdisjoint({(8, 0), (7, 5)})
    assert any(s.device.index not in (None, 0) for s in cuda)
    assert any(s.device.index is None for s in cuda)
    assert any(s.device.type == "xpu" and s.device.index for s in DRAWN)
    assert any(s.device.type == "cpu" and s.xpu_native_bf16 is not None for s in DRAWN)


def test_an_answer_fixed_to_the_course_devices_is_rejected() -> None:
    """Right on the eight devices the lesson names, wrong on the drawn ones: an answer that
    knows the course's devices by their index and the T4 by its capability."""
    def by_name(device):
        if device.type == "cuda":
            dtype = torch.float16 if torch.cuda.get_device_capability(device) == (7, 5) \
                else torch.bfloat16
            return f"cuda:{device.index}"[:6] if device.index else "cuda", dtype, dtype == FP16
        return reference_solution(device)

    result = check_autocast_settings(by_name)
    assert result.keys == {exercise.DEVICE_TYPE_WITH_INDEX, exercise.BF16_EMULATED}, str(result)
    assert "[cuda:7 (sm 89); cuda:1 (sm 70)]" in str(result)
    assert "[cuda:1 (sm 70)] dtype was torch.bfloat16" in str(result)


def test_a_function_that_sleeps_is_answered_at_the_first_limit() -> None:
    """Issue 44: a slow answer waited TIME_LIMIT_S on each of eight devices. The check stops at
    the first call past the limit, within the check's budget, and says where this exercise
    loops (real limits, real sleep: about 10 s)."""
    calls = []

    def sleeps(device):
        calls.append(device)
        time.sleep(3600)

    start = time.perf_counter()
    result = check_autocast_settings(sleeps)
    took = time.perf_counter() - start
    assert took < checking.CHECK_BUDGET_S + 2 and len(calls) == 1, (took, calls)
    assert result.keys == {checking.TIMED_OUT}
    assert "[cpu] autocast_settings was still running after 10 seconds" in str(result)
    assert f"look at {exercise.EXERCISE.loops}." in result.problems[0].message
