"""The ``masked_attention`` exercise (lesson 13): masked attention that stays right in float16, and
a checker that names the classic mistakes.

``check_masked_attention(fn)`` calls ``fn(q, k, v, mask)`` on four small CPU inputs made to break
float16 attention (a random mask with fully masked rows, a causal mask, scores near 20 and scores
beyond float16's range before scaling) in three settings: float16 tensors, float16 tensors under
CPU float16 autocast, and float32 tensors. It compares every result with attention computed in
float64 and names the mistake from where and how it went wrong, without reading the source. The
inputs must be unchanged after every call, and a ``q`` that requires grad (training) must work.
Last, a run on fake CUDA, XPU and MPS tensors under their float16 autocast shows a float32 region
switched off for one device type only (``torch.autocast("cpu", enabled=False)``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from amp_tutorial.autocast_policy import autocast_flags, fake_tensors
from amp_tutorial.exercises.checking import (
    INPUT_CHANGED,
    Attempt,
    CheckResult,
    Exercise,
    Problem,
    attempt,
    autocast_regions,
    error_problem,
    left_behind,
    type_problem,
)
from amp_tutorial.exercises.training_spy import SIMULATED_DEVICE_TYPES, simulated_name

# The problem: (batch, heads, seq, head_dim), small enough to check in well under a second.
BATCH, HEADS, SEQ, HEAD_DIM = 2, 2, 12, 64
FULLY_MASKED = (2, 7)  # query rows with no open position in the random mask (padding)
PADDED_KEY = 9  # a key column no query may attend, its query row open: the mask is not symmetric
# under transposition, so a fully-masked test along the wrong axis (mask.any(-2)) shows
MID_VALUE = 1.5  # q = k = +-1.5: the scaled self-score is 1.5**2 * 64 / 8 = 18, and e**18 > 65504
LARGE_VALUE = 64.0  # q = k = +-64: q.k = 262144 before the 1/sqrt(64) scale (fp16 max 65504),
# 32768 after it; +-1 vectors keep every score exact in float16 once scaled
# How far from float64 attention a right answer may be, per input dtype (measured, torch 2.14.1,
# Zen 4, the right spellings of the tests: float32 math within 7e-7 on the random and causal
# inputs, float16 math within 1.5e-3; bfloat16 math 7.8e-3 to 1.1e-2 off, float16 math on float32
# inputs 6.9e-4 on those two); the contract computes in the inputs' precision at least, so 16-bit
# math on float32 inputs and bfloat16 math on float16 inputs are wrong. Wrong formulas are 2 or
# more off. On the large-score inputs fp32 rounding alone moves a right float32 answer by up to
# 2.5e-4 (scores near 32768, scaled in two halves), so those get float16's allowance.
ATOL = {torch.float32: 1e-4, torch.float16: 0.004}
LOW_PRECISION_ATOL = 0.03  # off by more than ATOL but less than this: right math in fewer bits
NEAR = 0.1  # an output this close to another answer (no scale, inverted mask) is that answer
DEVICE_TYPE = "cpu"  # float16 tensors and float16 autocast both work on the CPU

# Problem keys: one per mistake the checker can name.
FILL_OVERFLOWS = "mask-fill-overflows-fp16"
FULLY_MASKED_NAN = "fully-masked-row-nan"
FULLY_MASKED_NOT_ZERO = "fully-masked-row-not-zero"
SCORES_OVERFLOW = "scores-overflow-fp16"
FP32_UNDONE_BY_AUTOCAST = "fp32-cast-undone-by-autocast"
SOFTMAX_OVERFLOWS = "softmax-exp-overflows"
MISSING_SCALE = "missing-scale"
MASK_INVERTED = "mask-inverted"
WRONG_DTYPE = "wrong-output-dtype"
WRONG_SHAPE = "wrong-output-shape"
NOT_LIKE_REFERENCE = "not-like-reference"
LOW_PRECISION_MATH = "computed-in-lower-precision"
WRONG_AXIS = "fully-masked-test-wrong-axis"
OTHER_DEVICE = "autocast-off-for-another-device"
__all__ = ["check_masked_attention", "make_cases",
           "reference_attention"]
PRAISE = ("All checks passed: float16 tensors, float16 under CPU autocast and float32 agree with "
          "float64 attention, with scores beyond float16's range, random and causal masks, and "
          "zeros for fully masked rows; the inputs stay unchanged and a q that requires grad "
          "works.")
EXERCISE = Exercise("13", "masked_attention", PRAISE, loops=(
    "any loop over rows or heads: the attention is a few whole-tensor operations "
    "(matmul, masked_fill, softmax, matmul), with no loop at all"))
OVERFLOW_ERROR = "cannot be converted to type c10::Half without overflow"  # torch's own words

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], object]


@dataclass(frozen=True)
class Scenario:
    """One setting: the dtype of q, k and v, and whether CPU float16 autocast is on."""

    name: str
    dtype: torch.dtype
    autocast: bool = False


FP16 = Scenario("float16", torch.float16)
AUTOCAST = Scenario("float16 under autocast", torch.float16, autocast=True)
FP32 = Scenario("float32", torch.float32)
SCENARIOS = (FP16, AUTOCAST, FP32)


@dataclass(frozen=True, eq=False)
class Case:
    """One input: float32 tensors whose values float16 holds exactly, and a boolean mask."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor  # True = may attend, shape (batch, heads, seq, seq)

    @functools.cached_property
    def expected(self) -> torch.Tensor:
        return reference_attention(self.q, self.k, self.v, self.mask)

    @functools.cached_property
    def without_scale(self) -> torch.Tensor:
        return reference_attention(self.q, self.k, self.v, self.mask, scale=1.0)

    @functools.cached_property
    def wrong_axis(self) -> torch.Tensor:
        """The expected output with the rows zeroed whose *key column* is fully masked."""
        return torch.where(self.mask.any(-2).unsqueeze(-1), self.expected, 0.0)

    @functools.cached_property
    def inverted(self) -> torch.Tensor:
        return reference_attention(self.q, self.k, self.v, ~self.mask)


RANDOM, CAUSAL, MID, LARGE = "random mask", "causal mask", "scores near 20", "scores beyond fp16"


@functools.cache
def make_cases(seed: int = 0) -> tuple[Case, ...]:
    """The four inputs, the same at every call, made without touching the global random state."""
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)

    def normal() -> torch.Tensor:
        return torch.randn(shape, generator=g).half().float()

    def signs() -> torch.Tensor:
        return torch.randint(0, 2, shape, generator=g).float() * 2 - 1

    eye = torch.eye(SEQ, dtype=torch.bool)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril().expand(BATCH, HEADS, SEQ, SEQ)
    random = (torch.rand((BATCH, HEADS, SEQ, SEQ), generator=g) < 0.5) | eye  # every row open
    random[..., 5, :] = eye[0]  # one query sees only the first key
    random[..., FULLY_MASKED, :] = False  # padded queries see nothing
    random[..., :, PADDED_KEY] = False  # a padded key nobody sees; its query still sees key 0
    random[..., PADDED_KEY, 0] = True
    mid, large = MID_VALUE * signs(), LARGE_VALUE * signs()
    return (Case(RANDOM, normal(), normal(), normal(), random),
            Case(CAUSAL, normal(), normal(), normal(), causal.clone()),
            Case(MID, mid, mid.clone(), normal(), causal.clone()),
            Case(LARGE, large, large.clone(), normal(), random.clone()))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                        scale: float | None = None) -> torch.Tensor:
    """Masked attention in float64, zeros for fully masked rows: what the checker compares with."""
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    weights = torch.where(mask.any(-1, keepdim=True), scores.softmax(-1), 0.0)
    return weights @ v


@dataclass
class Outcome:
    """What one call returned, judged: the open rows (queries with an open key) and the fully
    masked rows, each as a word, with the worst error of the open rows."""

    scenario: Scenario
    case: Case
    run: Attempt
    problem: Problem | None = None  # wrong return type or shape: nothing else was judged
    dtype: torch.dtype | None = None
    open_rows: str = "right"  # "right", "no scale", "inverted", "non-finite" or "wrong"
    masked_rows: str = "zero"  # "zero", "nan" or "not zero"
    error: float = 0.0
    left: list[Problem] = field(default_factory=list)  # what the call left behind


def _worst(out: torch.Tensor, expected: torch.Tensor, rows: torch.Tensor) -> float:
    """The largest absolute difference over ``rows``; inf if ``out`` is not finite there."""
    if not rows.any():
        return 0.0
    diff = (out[rows] - expected[rows]).abs()
    return math.inf if not diff.isfinite().all() else diff.max().item()


def _atol(outcome: Outcome) -> float:
    """How far from float64 a right answer may be for this input (see ATOL)."""
    if outcome.case.name in (RANDOM, CAUSAL):
        return ATOL[outcome.scenario.dtype]
    return ATOL[torch.float16]


def _judge(outcome: Outcome) -> None:
    value, case = outcome.run.value, outcome.case
    outcome.problem = type_problem(
        value, torch.Tensor, "masked_attention", "a tensor (the attention output)",
        "return the tensor `weights @ v`, shaped like v.")
    if outcome.problem is None and value.shape != case.v.shape:
        outcome.problem = Problem.named(
            WRONG_SHAPE, f"masked_attention returned shape {tuple(value.shape)} where v's shape "
            f"{tuple(case.v.shape)} (batch, heads, seq, head_dim) was expected.", "Each query "
            "gets one weighted sum of the value rows, so the output is shaped like v.",
            "return `weights @ v` (not the weights, and without transposing the result).")
    if outcome.problem is not None:
        return
    outcome.dtype = value.dtype
    out, mask = value.detach().double(), case.mask
    has_open = mask.any(-1)
    outcome.error = _worst(out, case.expected, has_open)
    atol = _atol(outcome)
    if atol < outcome.error <= LOW_PRECISION_ATOL:
        # a wrong output dtype is named as such (rounding the output shows this way too)
        outcome.open_rows = "low precision" if value.dtype == outcome.scenario.dtype else "right"
    elif outcome.error > atol:
        both = has_open & (~mask).any(-1)  # rows open under the mask and under its inverse
        if _worst(out, case.inverted, both) < min(NEAR, _worst(out, case.expected, both) / 4):
            outcome.open_rows = "inverted"
        elif _worst(out, case.wrong_axis, has_open) < atol:
            outcome.open_rows = "wrong axis"
        elif case.name in (RANDOM, CAUSAL) and _worst(out, case.without_scale, has_open) < NEAR:
            outcome.open_rows = "no scale"
        elif not out[has_open].isfinite().all():
            outcome.open_rows = "non-finite"
        else:
            outcome.open_rows = "wrong"
    masked = out[~has_open]
    if masked.isnan().any():
        outcome.masked_rows = "nan"
    elif masked.numel() and masked.abs().max().item() > LOW_PRECISION_ATOL:
        outcome.masked_rows = "not zero"


def _call(fn: AttentionFn, autocast: bool, *inputs: torch.Tensor
          ) -> tuple[Attempt, list[Problem]]:
    """``fn(*inputs)``, under CPU float16 autocast if asked, and what it left behind (learner
    code that switched autocast by hand, or changed an input in place)."""
    with torch.autocast(DEVICE_TYPE, dtype=torch.float16, enabled=autocast), \
            left_behind("masked_attention", tensors=dict(zip("qkv", inputs[:3], strict=True))
                        | {"mask": inputs[3]}) as left:
        run = attempt(fn, *inputs)
    return run, left


def _run(fn: AttentionFn, scenario: Scenario, case: Case) -> Outcome:
    q, k, v = (t.to(scenario.dtype, copy=True) for t in (case.q, case.k, case.v))  # copies
    run, left = _call(fn, scenario.autocast, q, k, v, case.mask.clone())
    outcome = Outcome(scenario, case, run, left=left)
    if run.error is None:
        _judge(outcome)
    return outcome




def _grad_problems(fn: AttentionFn) -> list[Problem]:
    """Call ``fn`` once with a float32 ``q`` that requires grad, as in training."""
    case = make_cases()[0]
    q = case.q.clone().requires_grad_()
    run, _ = _call(fn, False, q, case.k.clone(), case.v.clone(), case.mask.clone())
    if run.error is None:
        return []
    if "in-place operation" in str(run.error):  # the key of checking.left_behind's in-place
        return [Problem.named(
            INPUT_CHANGED, f"With a q that requires grad, masked_attention raised "
            f"{type(run.error).__name__}: {run.error}", "An in-place change (q.mul_(scale), "
            "q *= scale) of a tensor autograd needs is refused: any trained projection's "
            "output is one.", "compute new tensors: q = q * scale (not q *= scale).")]
    return [p for p in (error_problem(run, "masked_attention"),) if p is not None]


# -- other devices: a float32 region switched off for the wrong device type --------------------
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
            torch.ops.aten.baddbmm.default}


class _CastDownForMatmul(TorchDispatchMode):
    """Sees, below autocast, a float16 matmul after a float32 tensor was cast down to float16:
    the cast autocast inserts for a float32 input of an op on its lower-precision list (views of
    the cast tensor come between the two, so the order is what is checked, not the tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.cast_down = False
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32
                and kwargs.get("dtype") == torch.float16):
            self.cast_down = True
        elif func in _MATMULS and self.cast_down and any(
                getattr(a, "dtype", None) == torch.float16 for a in args):
            self.seen = True
        return func(*args, **kwargs)


def _simulated_problems(fn: AttentionFn, device_type: str) -> list[Problem]:
    """``fn`` on fake float16 ``device_type`` tensors (shapes and dtypes, no values) under that
    device's float16 autocast. ``torch.autocast("cpu", enabled=False)`` keeps the CPU runs right
    and leaves every other device's autocast on, which casts the float32 scores' matmul back to
    float16: named where that happened, also in a run that fake tensors could not finish (a
    right answer may read values, ``mask.any().item()``; on a Linux build fake MPS and XPU
    tensors stop at ``masked_fill``, "not linked with support").
    """
    watch = _CastDownForMatmul()
    try:
        with fake_tensors():
            q, k, v = (torch.empty(BATCH, HEADS, SEQ, HEAD_DIM, dtype=torch.float16,
                                   device=device_type) for _ in range(3))
            mask = torch.ones(BATCH, HEADS, SEQ, SEQ, dtype=torch.bool, device=device_type)
            with left_behind("masked_attention"), autocast_regions() as regions, \
                    autocast_flags(device_type, torch.float16), watch:
                attempt(fn, q, k, v, mask)
    except RuntimeError:  # this torch build has no such fake tensors: nothing to judge
        return []
    off = {dev for dev, on, _ in regions if not on}
    if device_type in off or not off or not watch.seen:  # fake MPS and XPU tensors may fail
        return []  # later (masked_fill: "not linked with support"); the product was seen
    named = ", ".join(f'"{dev}"' for dev in sorted(off))
    return [Problem.named(
        OTHER_DEVICE, f"You turned autocast off for device_type {named} only: on a GPU's "
        "tensors (simulated here) that GPU's autocast stays on and casts your float32 q and k "
        "back to float16 for the product, so the large input's scores (262144 before the "
        "scale) overflow float16's 65504 there, as if you had never cast them.", "Autocast "
        "keeps one switch per device type; a region for another type changes nothing on "
        "this one, which is why the CPU runs passed.", "take the device type from the "
        "inputs: `with torch.autocast(q.device.type, enabled=False):`.")]


def _where(outcomes: list[Outcome]) -> str:
    return ", ".join(dict.fromkeys(f"{o.case.name}" for o in outcomes))


def _fill_problem(raised: bool) -> Problem:
    what = ("On float16 scores your mask fill raised \"value cannot be converted to type "
            "c10::Half without overflow\"." if raised else
            "Fully masked rows came out NaN with float16 inputs but not with float32 ones: your "
            "fill value became -inf in float16.")
    return Problem.named(
        FILL_OVERFLOWS, what, "float16's most negative finite value is -65504, so -1e9 and "
        "torch.finfo(torch.float32).min do not exist in it: on a CPU "
        "masked_fill raises for them, while torch.where(mask, scores, -1e9), or an additive "
        "mask cast to float16, gives -inf silently, and a row of -inf is NaN after softmax.",
        "fill with the limit of the dtype you compute in, torch.finfo(scores.dtype).min, or "
        "compute the scores in float32; then set fully masked rows to zero.")


Found = list[tuple[Scenario, Problem]]  # each problem with a setting it showed up in


def _at(problem: Problem, where: list[Outcome]) -> Found:
    return [(scenario, problem) for scenario in dict.fromkeys(o.scenario for o in where)]


def _not_like_reference(wrong: list[Outcome]) -> Found:
    worst = max(o.error for o in wrong)
    how = "has NaN or inf" if math.isinf(worst) else f"differs from float64 attention by up to " \
        f"{worst:.3g} (the checker allows {max(ATOL.values())})"
    return _at(Problem.named(
        NOT_LIKE_REFERENCE, f"Your output {how} in rows that have open positions "
        f"({_where(wrong)}).", "Each query's output is the softmax over its open keys of q.k / "
        "sqrt(head_dim), taken over the last dimension, times v.", "compare your steps with "
        "F.scaled_dot_product_attention(q, k, v, attn_mask=mask) on a small input."), wrong)


def _limits() -> str:
    return ", ".join(f"{str(d).removeprefix('torch.')} within {t:g}" for d, t in ATOL.items())


def _low_precision(low: list[Outcome]) -> Found:
    worst = max(o.error for o in low)
    dtypes = " and ".join(dict.fromkeys(str(o.scenario.dtype).removeprefix("torch.")
                                        for o in low))
    return _at(Problem.named(
        LOW_PRECISION_MATH, f"Your output is off float64 attention by up to {worst:.3g} on "
        f"{dtypes} inputs ({_where(low)}), more than math in the inputs' own precision is "
        f"({_limits()}"
        "): it was computed in fewer bits than the inputs have.", "The inputs' dtype is the "
        "precision the caller chose: float32 inputs ask for float32 math (float16 keeps about "
        "3 significant digits, bfloat16 about 2), and bfloat16 keeps 8 significant bits "
        "against float16's 11, so computing float16 inputs in bfloat16 loses precision for "
        "nothing (here bfloat16 math is about 0.01 off, float16 math 0.0007).", "compute in "
        "the inputs' dtype or wider (the scores in float32, under autocast(enabled=False)), "
        "and return out.to(v.dtype)."), low)


def _magnitude_problems(wrong: list[Outcome]) -> Found:
    """Mistakes that only large scores show (the random and causal inputs came out right)."""
    mid = [o for o in wrong if o.case.name == MID and o.open_rows == "non-finite"]
    large = [o for o in wrong if o.case.name == LARGE]
    large_fp32 = [o for o in large if o.scenario == FP32 and o.open_rows == "non-finite"]
    if mid or large_fp32:
        what = ("scores of at most 18 after scaling, which float16 holds, gave inf or NaN in "
                "float16" if mid else "scores of 32768, finite in float32, gave NaN in float32")
        return _at(Problem.named(
            SOFTMAX_OVERFLOWS, f"Your softmax overflowed ({_where(mid or large_fp32)}): {what}.",
            "exp(x) exceeds float16's 65504 above x = 11.09 (float32's limit above 88.7), so "
            "exp(scores) / exp(scores).sum(...) is inf / inf = NaN. torch.softmax subtracts "
            "each row's maximum first; on this CPU its float16 result matches float32 within "
            "rounding. Under autocast, softmax and exp run in float32 on CUDA (its fp32 list), "
            "but on the CPU they are on no list and run in the dtype they get.",
            "torch.softmax(scores, dim=-1), or subtract scores.amax(-1, keepdim=True) before "
            "exp."), mid or large_fp32)
    if any(o.scenario == FP16 for o in large) and not any(o.scenario == FP32 for o in large):
        return _at(Problem.named(
            SCORES_OVERFLOW, "Rows with open positions went wrong on the large input in float16 "
            "(q.k up to 262144 before the 1/sqrt(64) scale, 32768 after) while float32 was "
            "right.", "float16 tops out at 65504: q @ k.T computed in float16 is inf before "
            "you scale it, and softmax of a row holding inf is NaN.", "scale q before the "
            "product, (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1), or compute the scores in "
            "float32 (outside autocast), or call F.scaled_dot_product_attention."), large)
    if large and all(o.scenario == AUTOCAST for o in large):
        return _at(Problem.named(
            FP32_UNDONE_BY_AUTOCAST, "Your function is right on float16 tensors but overflowed "
            "on the large input under CPU float16 autocast.", "Under autocast, q.float() @ "
            "k.float().transpose(-2, -1) still runs in float16: matmul (what @ calls) and bmm "
            "are on autocast's lower-precision list on CPU and on CUDA, so autocast casts their "
            "float32 inputs back down and the scores overflow 65504.", "compute the float32 "
            "part inside `with torch.autocast(q.device.type, enabled=False):`, or scale q "
            "before the product so the scores fit float16."), large)
    return _not_like_reference(wrong) if wrong else []


def _value_problems(outcomes: list[Outcome]) -> Found:
    """The mistakes read from the values: which input went wrong, in which setting, and how."""
    judged = [o for o in outcomes if o.run.error is None and o.problem is None]
    if inverted := [o for o in judged if o.open_rows == "inverted"]:
        return _at(Problem.named(  # every other symptom follows from this one
            MASK_INVERTED, "Your output matches attention with the mask inverted "
            f"({_where(inverted)}): it attended where the mask is False.", "Here, as in "
            "F.scaled_dot_product_attention's boolean attn_mask, True means may attend.",
            "mask out ~mask (masked_fill(~mask, ...)), or pass attn_mask=mask to SDPA as it "
            "is."), inverted)
    if axis := [o for o in judged if o.open_rows == "wrong axis"]:
        return _at(Problem.named(
            WRONG_AXIS, f"Rows that have open keys came out zero ({_where(axis)}): the query "
            f"whose key {PADDED_KEY} nobody may attend was zeroed as if it were fully masked.",
            "A fully masked row is a query with no open key: mask.any(-1) (over the keys, the "
            "last dimension). mask.any(-2) asks, per key, whether any query may see it, and "
            "zeroes the wrong rows wherever the mask is not symmetric (padding of keys, cross "
            "attention).", "torch.where(mask.any(-1, keepdim=True), out, 0.0)."), axis)
    wrong = [o for o in judged if o.open_rows not in ("right", "low precision")]
    ordinary = [o for o in wrong if o.case.name in (RANDOM, CAUSAL)]
    if no_scale := [o for o in ordinary if o.open_rows == "no scale"]:
        found = _at(Problem.named(
            MISSING_SCALE, f"Your output matches attention without the 1/sqrt(head_dim) scale "
            f"({_where(no_scale)}).", "Unscaled scores are sqrt(64) = 8 times larger: the "
            "softmax is sharper than scaled dot-product attention's, and in float16 the scores "
            "overflow 8 times sooner.", "multiply q (or the scores, in float32) by "
            "q.shape[-1] ** -0.5, F.scaled_dot_product_attention's default scale."), no_scale)
    elif ordinary:  # the ordinary inputs are wrong: say only that
        found = _not_like_reference(ordinary)
    else:
        found = _magnitude_problems(wrong)
    if not found and (low := [o for o in judged if o.open_rows == "low precision"]):
        found = _low_precision(low)
    nan_rows = [o for o in judged if o.masked_rows == "nan"]
    if any(o.scenario == FP32 for o in nan_rows):
        found += _at(Problem.named(
            FULLY_MASKED_NAN, "Rows whose mask is all False came out NaN, in float32 too.",
            "With -inf as the fill, such a row is all -inf and softmax computes 0/0 = NaN "
            "(multiplying by 0 afterwards keeps it NaN); the contract is zeros, since the query "
            "attends to nothing, and a NaN spreads into the loss and every gradient.",
            "after the softmax, torch.where(mask.any(-1, keepdim=True), weights, 0) (where "
            "picks 0 even where the other branch is NaN), or weights.nan_to_num(0.0)."),
            nan_rows)
    elif nan_rows:
        found += _at(_fill_problem(raised=False), nan_rows)
    if not_zero := [o for o in judged if o.masked_rows == "not zero"]:
        found += _at(Problem.named(
            FULLY_MASKED_NOT_ZERO, "Rows whose mask is all False were not zero.", "A finite "
            "fill such as torch.finfo(dtype).min turns such a row into a uniform softmax, so "
            "the padded query averages all values; the contract is zeros (it attends to "
            "nothing, as F.scaled_dot_product_attention returns on the CPU).",
            "torch.where(mask.any(-1, keepdim=True), weights, 0) after the softmax."), not_zero)
    return found


@EXERCISE.checker
def check_masked_attention(fn: AttentionFn) -> CheckResult:
    """Run ``fn(q, k, v, mask)`` on the exercise's inputs in each setting and name every mistake.

    ``fn`` must return attention of q, k and v (batch, heads, seq, head_dim) where ``mask`` (bool,
    True = may attend) allows, scaled by 1/sqrt(head_dim), in v's dtype, with zeros for fully
    masked rows. Takes well under a second on a laptop CPU, after a few seconds the first time in
    a process (fake tensors import ``torch._dynamo``, outside the learner's time limit).
    """
    outcomes: list[Outcome] = []
    for scenario in SCENARIOS:
        for case in make_cases():
            outcomes.append(_run(fn, scenario, case))
            if outcomes[-1].run.timed_out:
                break  # one endless loop is enough to report
        if outcomes[-1].run.timed_out:
            break
    found: dict[Scenario, list[Problem]] = {s: [] for s in SCENARIOS}
    for scenario, problem in _value_problems(outcomes):
        found[scenario].append(problem)
    for o in outcomes:
        if o.problem is not None:
            found[o.scenario].append(o.problem)
        elif o.dtype is not None and o.dtype != o.scenario.dtype:
            found[o.scenario].append(Problem.named(
                WRONG_DTYPE, f"masked_attention returned {o.dtype} for {o.scenario.dtype} "
                "inputs.", "The contract is v's dtype: float32 where float16 was expected doubles "
                "the memory of everything after it, and float16 for float32 inputs drops the "
                "precision the caller chose.",
                "compute in the precision you need, then return out.to(v.dtype)."))
        overflowed = o.run.error is not None and OVERFLOW_ERROR in str(o.run.error)
        if overflowed:
            found[o.scenario].append(_fill_problem(raised=True))
        if crashed := error_problem(o.run, "masked_attention", after_others=overflowed):
            found[o.scenario].append(crashed)
        found[o.scenario] += o.left
    timed_out = any(o.run.timed_out for o in outcomes)
    named = [(s.name, problems) for s, problems in found.items()]
    grad = [] if timed_out else _grad_problems(fn)
    devices = [] if timed_out else [(simulated_name(d), _simulated_problems(fn, d))
                                    for d in SIMULATED_DEVICE_TYPES]
    return EXERCISE.report([*named, ("float32, q requires grad", grad), *devices])
