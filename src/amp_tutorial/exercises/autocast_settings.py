"""The ``autocast_settings`` exercise (lesson 01): from a ``torch.device``, the ``device_type`` for
``torch.autocast``, the autocast dtype, and whether a GradScaler is needed.

``check_autocast_settings(fn)`` calls the learner's function for a CPU (alone, beside a simulated
T4, and beside an Apple GPU: the answer must follow the device given, not what is available),
``cuda:0`` on a simulated Ampere GPU (native bf16) and on a simulated T4 (bf16 only emulated),
``mps``, and ``xpu:0`` with and without native bf16; then on devices ``random.Random(DRAW_SEED)``
draws (:data:`DRAWN`): NVIDIA GPUs of other compute capabilities at other indices, a device given
without an index, an Intel GPU, a CPU beside an Intel GPU. A device is simulated by replacing, for
the call only, the torch functions a correct answer asks (:data:`SIMULATED`); everything is
restored afterwards, autocast's own state included. In each scenario the reference answer
(``exercises.solutions.autocast_settings``) runs beside the learner's under the same simulation;
an answer equal to the reference's everywhere passes, however it is written (a list, a
NamedTuple, a dict of rules). Where they differ, the named problems say which value and why;
each answer is handed to ``torch.autocast`` (entered; on the CPU a matmul inside shows the dtype),
and the messages quote what autocast did with it. A call past the time limit ends the check: the
other devices are not tried. ROCm is left out: ``torch.cuda.is_bf16_supported()``
says True for every ROCm GPU, so the course reads the architecture there
(``amp_tutorial.device.rocm_bf16_native``).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

import torch

from amp_tutorial.exercises.checking import (
    WRONG_RETURN,
    CheckResult,
    Exercise,
    Problem,
    attempt,
    error_problem,
    left_behind,
    stops,
    type_problem,
)
from amp_tutorial.exercises.solutions.autocast_settings import (
    autocast_settings as reference_answer,
)

# Problem keys: one per mistake the checker can name.
DEVICE_TYPE_NOT_STR = "device-type-not-str"
DEVICE_TYPE_WITH_INDEX = "device-type-with-index"
DEVICE_TYPE_HARD_CODED = "device-type-hard-coded-cuda"
DEVICE_TYPE_OTHER_DEVICE = "device-type-of-another-device"
DEVICE_TYPE_UNKNOWN = "device-type-unknown"
DTYPE_NOT_TORCH_DTYPE = "dtype-not-torch-dtype"
DTYPE_NOT_16_BIT = "dtype-not-16-bit"
FP16_ON_CPU = "fp16-on-cpu"
BF16_EMULATED = "bf16-where-only-emulated"
BF16_NATIVE_IGNORED = "fp16-where-bf16-is-native"
BF16_ON_MPS = "bf16-on-mps"
NO_SCALER_WITH_FP16 = "no-scaler-with-fp16"
SCALER_WITH_BF16 = "scaler-with-bf16"
SCALER_NOT_BOOL = "scaler-not-bool"
WRONG_ORDER = "wrong-order"
__all__ = ["check_autocast_settings", "expected_settings"]
PRAISE = ("All checks passed: device_type, dtype and use_scaler are right for the CPU (also on "
          "machines with a CUDA, an Apple or an Intel GPU), an Ampere "
          "and a T4 GPU, NVIDIA GPUs of other generations at other indices, MPS, and an XPU "
          "with and without native bfloat16, and torch.autocast "
          "took every answer (on the CPU a matmul inside it ran in bfloat16).")
EXERCISE = Exercise("01", "autocast_settings", PRAISE, loops=(
    "anything that waits or repeats: the answer needs no loop, only a few checks of "
    "device.type and one call such as torch.cuda.is_bf16_supported()"))

# The torch functions a scenario replaces (owner, attribute): what a correct answer may ask.
SIMULATED = (
    (torch.cuda, "is_available"),
    (torch.cuda, "is_bf16_supported"),
    (torch.cuda, "get_device_capability"),
    (torch.backends.mps, "is_available"),
    (torch.xpu, "is_available"),
    (torch.xpu, "is_bf16_supported"),
)
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")  # the device types the exercise covers

SettingsFn = Callable[[torch.device], object]


@dataclass(frozen=True)
class Scenario:
    """One call of the learner's function: the device, and the machine the checker simulates.

    ``cuda_capability``: an NVIDIA GPU of that compute capability (None: no CUDA);
    ``xpu_native_bf16``: an Intel GPU, with or without native bf16 (None: no XPU).
    """

    name: str  # short, for the report's [scenario, ...] prefix (no commas)
    what: str  # the device in words, for the messages
    device: torch.device
    cuda_capability: tuple[int, int] | None = None
    xpu_native_bf16: bool | None = None
    mps: bool = False

    @property
    def native_bf16(self) -> bool:
        """Whether this device computes bf16 natively (CPU: bf16 whatever its instructions)."""
        if self.device.type == "cuda":
            return self.cuda_capability is not None and self.cuda_capability[0] >= 8
        if self.device.type == "xpu":
            return bool(self.xpu_native_bf16)
        return self.device.type == "cpu"


SCENARIOS = (
    Scenario("cpu", "the CPU", torch.device("cpu")),
    Scenario("cuda:0 (Ampere)", "simulated Ampere GPU (compute capability 8.0, native bf16)",
             torch.device("cuda", 0), cuda_capability=(8, 0)),
    Scenario("cuda:0 (T4)", "simulated T4 (compute capability 7.5, bf16 only emulated)",
             torch.device("cuda", 0), cuda_capability=(7, 5)),
    Scenario("mps", "Apple GPU (MPS)", torch.device("mps"), mps=True),
    Scenario("xpu:0 (native bf16)", "simulated Intel GPU with native bf16",
             torch.device("xpu", 0), xpu_native_bf16=True),
    Scenario("xpu:0 (bf16 emulated)", "simulated Intel GPU that only emulates bf16",
             torch.device("xpu", 0), xpu_native_bf16=False),
    Scenario("cpu (CUDA present)", "the CPU of a machine with a simulated T4",
             torch.device("cpu"), cuda_capability=(7, 5)),
    Scenario("cpu (MPS present)", "the CPU of a Mac with an Apple GPU", torch.device("cpu"),
             mps=True),
)


DRAW_SEED = 1


def _draw_scenarios() -> tuple[Scenario, ...]:
    """Devices beyond the course's: an NVIDIA GPU with native bf16 and one without (compute
    capabilities and indices drawn), a CUDA device given without an index, an Intel GPU at
    another index, and the CPU of a machine with an Intel GPU."""
    rng = random.Random(DRAW_SEED)
    native = rng.choice(((8, 6), (8, 9), (9, 0), (10, 0), (12, 0)))
    emulated = rng.choice(((6, 0), (6, 1), (7, 0)))
    xpu_native = rng.random() < 0.5
    first, second, xpu = rng.sample(range(1, 8), 3)
    sm = "compute capability {}.{}".format
    return (
        Scenario(f"cuda:{first} (sm {native[0]}{native[1]})", f"simulated NVIDIA GPU "
                 f"({sm(*native)}, native bf16)", torch.device("cuda", first),
                 cuda_capability=native),
        Scenario(f"cuda:{second} (sm {emulated[0]}{emulated[1]})", f"simulated NVIDIA GPU "
                 f"({sm(*emulated)}, bf16 only emulated)", torch.device("cuda", second),
                 cuda_capability=emulated),
        Scenario("cuda (no index)", f"simulated NVIDIA GPU ({sm(*native)}) given as "
                 'torch.device("cuda")', torch.device("cuda"), cuda_capability=native),
        Scenario(f"xpu:{xpu} ({'native' if xpu_native else 'emulated'} bf16)", "simulated "
                 f"Intel GPU {'with native' if xpu_native else 'that only emulates'} bf16",
                 torch.device("xpu", xpu), xpu_native_bf16=xpu_native),
        Scenario("cpu (XPU present)", "the CPU of a machine with a simulated Intel GPU",
                 torch.device("cpu"), xpu_native_bf16=True),
    )


DRAWN = _draw_scenarios()
ALL_SCENARIOS = SCENARIOS + DRAWN


def expected_settings(scenario: Scenario) -> tuple[str, torch.dtype, bool]:
    """The course's answer: bf16 where the device computes it natively (always on the CPU, never
    on MPS), fp16 otherwise; a GradScaler exactly for fp16."""
    dtype = torch.bfloat16 if scenario.native_bf16 else torch.float16
    return scenario.device.type, dtype, dtype == torch.float16


def simulate(scenario: Scenario, stack: ExitStack) -> None:
    """Make torch answer as ``scenario``'s machine until ``stack`` closes (NVIDIA, not ROCm)."""
    capability, xpu_native = scenario.cuda_capability, scenario.xpu_native_bf16

    def cuda_is_bf16_supported(including_emulation: bool = True) -> bool:
        # torch/cuda/__init__.py: True from compute capability 8.0; below, only with emulation
        return capability is not None and (capability[0] >= 8 or including_emulation)

    def get_device_capability(device: object = None) -> tuple[int, int]:
        if capability is None:
            raise RuntimeError("no CUDA GPU in this scenario (simulated by the checker)")
        return capability

    def xpu_is_bf16_supported(including_emulation: bool = True) -> bool:
        # torch/xpu/__init__.py: True with emulation, else has_bfloat16_conversions
        return xpu_native is not None and (including_emulation or xpu_native)

    fakes = (lambda: capability is not None, cuda_is_bf16_supported, get_device_capability,
             lambda: scenario.mps, lambda: xpu_native is not None, xpu_is_bf16_supported)
    for (owner, name), fake in zip(SIMULATED, fakes, strict=True):
        stack.enter_context(mock.patch.object(owner, name, fake, create=True))
    stack.enter_context(mock.patch.object(torch.version, "hip", None))  # NVIDIA, not ROCm
    keep_autocast_state(stack)


def keep_autocast_state(stack: ExitStack) -> None:
    """Restore every device type's autocast switch and dtype when ``stack`` closes: an autocast
    that fails in ``__enter__`` (a dtype given as a string) has already switched itself on."""
    saved = {t: (torch.is_autocast_enabled(t), torch.get_autocast_dtype(t)) for t in DEVICE_TYPES}

    def restore() -> None:
        for device_type, (enabled, dtype) in saved.items():
            torch.set_autocast_enabled(device_type, enabled)
            torch.set_autocast_dtype(device_type, dtype)

    stack.callback(restore)


@dataclass(frozen=True)
class AutocastReaction:
    """What ``torch.autocast(device_type=..., dtype=...)`` did with an answer, entered once."""

    call: str
    error: str | None = None  # "RuntimeError: ..." when constructing or entering it raised
    warning: str | None = None  # its warning, when it switched itself off
    matmul_dtype: torch.dtype | None = None  # on the CPU: the dtype of a float32 matmul inside

    @property
    def accepted(self) -> bool:
        return self.error is None and self.warning is None

    def __str__(self) -> str:
        if self.error:
            return f"{self.call} raised {self.error}"
        matmul = (f" (a float32 matmul on the CPU inside it ran in {self.matmul_dtype})"
                  if self.matmul_dtype is not None else "")
        if self.warning:
            return f"{self.call} warned \"{self.warning}\" and switched itself off{matmul}"
        return f"{self.call} took it without a warning{matmul}"


def autocast_reaction(device_type: object, dtype: object, device: torch.device
                      ) -> AutocastReaction:
    """Construct and enter ``torch.autocast`` with an answer; on the CPU run a matmul inside."""
    call = f"torch.autocast(device_type={device_type!r:.40}, dtype={dtype!r:.40})"
    matmul_dtype = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autocast(device_type=device_type, dtype=dtype):  # type: ignore[arg-type]
                if device.type == "cpu":
                    matmul_dtype = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        except Exception as error:  # what autocast says is the point: quote it
            return AutocastReaction(call, error=f"{type(error).__name__}: {error}")
    said = [str(w.message).splitlines()[0] for w in caught if "autocast" in str(w.message)]
    return AutocastReaction(call, warning=said[0] if said else None, matmul_dtype=matmul_dtype)


def _kind(value: object) -> str:
    if isinstance(value, torch.dtype):
        return "dtype"
    if isinstance(value, bool):
        return "scaler"
    return "device" if isinstance(value, (str, torch.device)) else "other"


def _shown(device: torch.device) -> str:
    return f'torch.device("{device}")'


def _shape_problem(answer: object) -> Problem | None:
    """Not three values in a tuple, or the three in the wrong order."""
    if problem := type_problem(answer, (tuple, list), "autocast_settings",
                               "a tuple (device_type, dtype, use_scaler)",
                               "end with `return device_type, dtype, use_scaler`."):
        return problem
    assert isinstance(answer, (tuple, list))
    if len(answer) != 3:
        return Problem.named(
            WRONG_RETURN, f"autocast_settings returned {len(answer)} values ({answer!r:.80}) "
            "where three were expected.", "The caller unpacks "
            "`device_type, dtype, use_scaler = autocast_settings(device)`, which needs exactly "
            "three.", "end with `return device_type, dtype, use_scaler`.")
    kinds = [_kind(v) for v in answer]
    if sorted(kinds) == ["device", "dtype", "scaler"] and kinds != ["device", "dtype", "scaler"]:
        return Problem.named(
            WRONG_ORDER, f"autocast_settings returned {tuple(answer)!r:.100}: the right kinds of "
            "values in the wrong order.", "The caller unpacks "
            "`device_type, dtype, use_scaler = autocast_settings(device)`, so each value lands "
            "in the wrong name.", "return them in the order (device_type, dtype, use_scaler).")
    return None


def _device_type_problem(value: object, scenario: Scenario, reaction: AutocastReaction
                         ) -> Problem | None:
    device, device_type = scenario.device, scenario.device.type
    fix = f"return device.type (here {device_type!r}), the type of the device you were given."
    if not isinstance(value, str):
        return Problem.named(
            DEVICE_TYPE_NOT_STR, f"device_type was {value!r:.60}, a {type(value).__name__}, not "
            "a string.", f"torch.autocast takes the device type as a str: {reaction}.", fix)
    if value == device_type:
        return None
    base = value.split(":")[0]
    if base == device_type:
        return Problem.named(
            DEVICE_TYPE_WITH_INDEX, f"device_type was {value!r} for {_shown(device)}: the "
            "device with its index.", "Autocast keeps one switch per device type, not per "
            'device: torch.autocast("cuda:1") switches it on for every CUDA GPU, not only for '
            f"GPU 1. {reaction}, but the checks torch.autocast and GradScaler make for CUDA "
            'compare the string with "cuda" and are skipped for "cuda:0" (torch/amp/'
            "autocast_mode.py, torch/amp/grad_scaler.py): on a machine without "
            "CUDA both stay on instead of warning and switching themselves off, and autocast "
            "no longer refuses bfloat16 where torch.cuda.is_bf16_supported() is False.",
            f"{fix} Never str(device).")
    effect = ("Autocast keeps one switch per device type and changes only ops on tensors of "
              f"that type, so the ops on {_shown(device)} would run without it")
    available = ((scenario.cuda_capability is not None and base == "cuda")
                 or (scenario.mps and base == "mps")
                 or (scenario.xpu_native_bf16 is not None and base == "xpu"))
    if available:  # the type of an accelerator this machine has, for a device of another type
        return Problem.named(
            DEVICE_TYPE_OTHER_DEVICE, f"device_type was {value!r} for {_shown(device)} on a "
            f"machine that also has a {base} device.", f"{effect} ({reaction}). A machine with "
            "a GPU still runs code on its CPU (data loading, a model kept there on purpose), so "
            "the device given decides, not which devices torch finds available.",
            f"{fix} Read it from the device, not from torch.cuda.is_available() or "
            "torch.backends.mps.is_available().")
    if base == "cuda":
        return Problem.named(
            DEVICE_TYPE_HARD_CODED, f'device_type was a hard-coded "cuda" for {_shown(device)}.',
            f"{effect}; and {reaction}.", fix)
    if base in DEVICE_TYPES:
        return Problem.named(
            DEVICE_TYPE_OTHER_DEVICE, f"device_type was {value!r} for {_shown(device)}.",
            f"{effect} ({reaction}).",
            f"{fix} Read it from the device, not from which devices torch finds available.")
    return Problem.named(
        DEVICE_TYPE_UNKNOWN, f"device_type was {value!r}, not a device type torch knows.",
        f"{reaction}.", f"{fix} The types are {', '.join(map(repr, DEVICE_TYPES))}.")


def _dtype_problem(dtype: object, scenario: Scenario, reaction: AutocastReaction,
                   expected: torch.dtype) -> Problem | None:
    """``expected``: the reference answer's dtype for this scenario."""
    device = _shown(scenario.device)
    if not isinstance(dtype, torch.dtype):
        return Problem.named(
            DTYPE_NOT_TORCH_DTYPE, f"dtype was {dtype!r:.60}, a {type(dtype).__name__}, not a "
            "torch.dtype.", f"torch.autocast needs the dtype object itself: {reaction}.",
            "return torch.float16 or torch.bfloat16 (the objects, not their names).")
    if dtype not in (torch.float16, torch.bfloat16):
        return Problem.named(
            DTYPE_NOT_16_BIT, f"dtype was {dtype} for {device}.", "Autocast runs the ops on its "
            f"lower-precision list in a 16-bit format, float16 or bfloat16: {reaction}.",
            "return torch.bfloat16 or torch.float16, by the rule in the task.")
    if dtype == expected:
        return None
    kind = scenario.device.type
    if kind == "cpu":
        return Problem.named(
            FP16_ON_CPU, "dtype was torch.float16 for the CPU.", "The rule for the CPU is "
            "bfloat16: CPU autocast's own default (torch.get_autocast_dtype(\"cpu\") is "
            f"{torch.get_autocast_dtype('cpu')}), with float32's exponent range, so no "
            "GradScaler is needed. float16 runs on a CPU too (the course rehearses the GPU path "
            "with it), but then needs a scaler.",
            "return torch.bfloat16 for every CPU; the device line at the top of the lesson says "
            "whether yours computes it natively or emulates it.")
    if kind == "mps":
        return Problem.named(
            BF16_ON_MPS, "dtype was torch.bfloat16 for MPS.", "PyTorch offers no way to ask "
            "an Apple GPU whether it computes bfloat16 natively (torch.mps has no "
            "is_bf16_supported), so the rule for MPS is float16.",
            'return torch.float16 for device.type == "mps".')
    module = f"torch.{kind}"
    if dtype == torch.bfloat16:
        return Problem.named(
            BF16_EMULATED, f"dtype was torch.bfloat16 on the {scenario.what}.",
            "torch.cuda.is_bf16_supported() and torch.xpu.is_bf16_supported() count emulated "
            "bfloat16 unless you pass including_emulation=False: the CUDA one says True on an "
            "NVIDIA GPU below compute capability 8.0 (V100, T4) whenever a bfloat16 tensor can "
            "be made there, the XPU one on every XPU (torch/cuda/__init__.py and "
            "torch/xpu/__init__.py). Autocast does not object either: "
            f"{reaction}. The rule takes bfloat16 only where the device computes it natively.",
            f"ask {module}.is_bf16_supported(including_emulation=False) and return "
            "torch.float16 when it says False.")
    return Problem.named(
        BF16_NATIVE_IGNORED, f"dtype was torch.float16 on the {scenario.what}.",
        f"{module}.is_bf16_supported(including_emulation=False) says True here (NVIDIA: compute "
        "capability 8.0 or newer; Intel: the device reports bfloat16 conversions), and the rule "
        "takes bfloat16 wherever it is native: float32's exponent range, so no GradScaler and "
        "no overflow to manage.",
        f"return torch.bfloat16 when {module}.is_bf16_supported(including_emulation=False) is "
        "True.")


def _scaler_problem(use_scaler: object, dtype: object) -> Problem | None:
    fix = "return use_scaler = (dtype == torch.float16)."
    if not isinstance(use_scaler, bool):
        return Problem.named(
            SCALER_NOT_BOOL, f"use_scaler was {use_scaler!r:.60}, a {type(use_scaler).__name__},"
            " not True or False.", "It is a yes/no answer that the caller passes on, as in "
            "torch.amp.GradScaler(device_type, enabled=use_scaler), which goes by its truth "
            "value: an object such as a GradScaler, even a disabled one, counts as True and "
            "switches scaling on.", fix)
    if dtype == torch.float16 and not use_scaler:
        tiny = torch.finfo(torch.float16).smallest_normal * torch.finfo(torch.float16).eps
        return Problem.named(
            NO_SCALER_WITH_FP16, "use_scaler was False with torch.float16.", "float16 has 5 "
            f"exponent bits: its smallest subnormal is 2**-24 ({tiny:.2g}), and gradients below "
            "half of that round to zero (section 1). A GradScaler multiplies the loss so they "
            "stay representable (lesson 02).", fix)
    if dtype == torch.bfloat16 and use_scaler:
        return Problem.named(
            SCALER_WITH_BF16, "use_scaler was True with torch.bfloat16.", "bfloat16 has "
            "float32's 8 exponent bits, so its gradients do not underflow as float16's do and "
            "the rule gives it no GradScaler. An enabled scaler would still multiply the loss, "
            "unscale every gradient and check it for inf/NaN, and read that check back with "
            ".item() at every step (torch/amp/grad_scaler.py), for nothing.", fix)
    return None


def _equal(value: object, right: object) -> bool:
    """``value == right`` as a plain truth value (a tensor's comparison is not one)."""
    if isinstance(value, torch.Tensor):
        return False
    try:
        return bool(value == right)
    except Exception:  # noqa: BLE001 - an object whose == cannot answer: not the same
        return False


def _scenario_problems(fn: SettingsFn, scenario: Scenario
                       ) -> tuple[list[Problem], AutocastReaction | None]:
    """The mistakes in one call, and what autocast did with the answer (None: no answer): the
    reference answer runs first under the same simulation, and a value equal to its value is
    right however it was reached."""
    with ExitStack() as stack:
        simulate(scenario, stack)
        right = reference_answer(scenario.device)
        with left_behind("autocast_settings") as left:
            run = attempt(fn, scenario.device)
        if run.error is not None:
            crashed = error_problem(run, "autocast_settings")
            return ([crashed] if crashed else []) + left, None
        if shape := _shape_problem(run.value):
            return [shape, *left], None
        device_type, dtype, use_scaler = run.value
        reaction = autocast_reaction(device_type, dtype, scenario.device)
    same = [_equal(value, r) for value, r in zip(run.value, right, strict=True)]
    found = [None if same[0] else _device_type_problem(device_type, scenario, reaction),
             None if same[1] else _dtype_problem(dtype, scenario, reaction, right[1]),
             None if same[2] else _scaler_problem(use_scaler, dtype)]
    # each rule names every value that differs from the reference's (it follows the same rule,
    # tests/unit/test_exercise_autocast_settings.py), so no bare "differs" is needed here
    return [problem for problem in found if problem is not None] + left, reaction


@EXERCISE.checker
def check_autocast_settings(fn: SettingsFn) -> CheckResult:
    """Call ``fn(device)`` for every scenario (a CPU, simulated GPUs) and name every mistake.

    ``fn`` must return ``(device_type, dtype, use_scaler)``. Takes well under a second.
    A right answer that this torch's autocast refuses (an older torch, a device type it was not
    built for) still passes; the praise then says so instead of claiming autocast took it.
    """
    found, refused = [], []
    for scenario in ALL_SCENARIOS:
        problems, reaction = _scenario_problems(fn, scenario)
        found.append((scenario.name, problems))
        if not problems and reaction is not None and not reaction.accepted:
            refused.append(f"[{scenario.name}] {reaction}")
        if stops(problems):
            break  # one endless call is enough to wait for
    praise = PRAISE if not refused else (
        "All checks passed: device_type, dtype and use_scaler are right for the CPU (also on "
        "machines with a CUDA, an Apple or an Intel GPU), an Ampere and a T4 GPU, NVIDIA GPUs "
        "of other generations at other indices, MPS, and an XPU with and without native "
        "bfloat16. The torch installed here did not take every right answer, a limit of this "
        "torch and not of your function: " + "; ".join(refused) + ".")
    if any(p.key == DEVICE_TYPE_HARD_CODED for _, problems in found for p in problems):
        # "cuda" for the CPU of a CUDA machine is the hard-coded "cuda" named there: once
        found = [(name, [p for p in problems if not (p.key == DEVICE_TYPE_OTHER_DEVICE
                                                     and "'cuda' for" in p.message)])
                 for name, problems in found]
    return EXERCISE.report(found, praise)
