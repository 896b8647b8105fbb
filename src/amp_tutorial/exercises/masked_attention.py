"""The ``masked_attention`` exercise (lesson 13): masked attention that stays right in float16, and
a checker that names the classic mistakes.

``check_masked_attention(fn)`` calls ``fn(q, k, v, mask)`` on four fixed small CPU inputs made to
break float16 attention (a random mask with fully masked rows, a causal mask, scores near 20 and
scores beyond float16's range before scaling) and seven drawn ones (``random.Random(13)``): each
mask pattern of ``MASKS`` on its own shape (batch, heads, seq, head_dim), and lesson 13's
opposite-sign entries, where a query's one open key scores below -1e4 and masked keys above it. It
runs them in four settings: float16 tensors, float16 tensors under CPU float16 autocast, float32
and bfloat16 tensors. Every result is compared with the reference answer's
(``exercises.solutions.masked_attention``) on the same inputs, within a tolerance of the inputs'
precision; a mistake is named from where and how it went wrong (against float64 attention and its
wrong variants), without reading the source. The inputs must be unchanged after every call, and a
``q`` that requires grad (training) must work. Last, a run on fake CUDA, XPU and MPS tensors under
their float16 autocast shows a float32 region switched off for one device type only
(``torch.autocast("cpu", enabled=False)``)."""

from __future__ import annotations

import functools
import math
import random
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
from amp_tutorial.exercises.solutions.masked_attention import masked_attention as reference_answer
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
# How far from the reference answer's output, run beside the learner's on the same inputs, a
# right answer may be, per input dtype (measured, 2-core Zen 3, torch 2.14.1, the right spellings
# of the tests on every input: float32 within 5.4e-7, float16 within 1.95e-3 (q scaled first in
# float16: two roundings), bfloat16 within 1.6e-2; float16 math on float32 inputs is 1e-4 to
# 9.6e-4 off, bfloat16 math on float16 inputs 6.8e-3 to 1.1e-2). The fixed large-score input
# ("scores beyond fp16") has near-ties that fp32 rounding of scores near 32768 tips: a right
# float32 answer lands up to 2.5e-4 away there, so it keeps float16's allowance.
REFERENCE_ATOL = {torch.float32: 1e-5, torch.float16: 0.004, torch.bfloat16: 0.03}
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
FILL_NOT_LOW_ENOUGH = "mask-fill-not-below-the-scores"
LOW_PRECISION_MATH = "computed-in-lower-precision"
WRONG_AXIS = "fully-masked-test-wrong-axis"
OTHER_DEVICE = "autocast-off-for-another-device"
__all__ = ["check_masked_attention", "make_cases",
           "reference_attention"]
PRAISE = ("All checks passed: float16 tensors, float16 under CPU autocast, float32 and bfloat16 "
          "agree with a right answer, with scores beyond float16's range and of opposite signs, "
          "several shapes and mask patterns, and zeros for fully masked rows; the inputs stay "
          "unchanged and a q that requires grad works.")
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
BF16 = Scenario("bfloat16", torch.bfloat16)
SCENARIOS = (FP16, AUTOCAST, FP32, BF16)


@dataclass(frozen=True, eq=False)
class Case:
    """One input: float32 tensors whose values float16 holds exactly, and a boolean mask."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor  # True = may attend, shape (batch, heads, seq, seq)
    kind: str = ""  # ORDINARY, MID, LARGE or OPPOSITE: which rules the input is there for

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
ORDINARY, OPPOSITE = "ordinary", "opposite signs"  # the other kinds of input
DRAW_SEED = 13


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
    return (Case(RANDOM, normal(), normal(), normal(), random, ORDINARY),
            Case(CAUSAL, normal(), normal(), normal(), causal.clone(), ORDINARY),
            Case(MID, mid, mid.clone(), normal(), causal.clone(), MID),
            Case(LARGE, large, large.clone(), normal(), random.clone(), LARGE),
            *_drawn_cases(DRAW_SEED))


MASKS = ("causal", "key padding", "sliding window", "random, some rows fully masked",
         "one open key per row")
# Lesson 13's entries of 40, head_dim 64 (q.k = 102400 before the scale, 12800 after), and two
# more of the same size: (entry, head_dim), scaled scores entry**2 * sqrt(head_dim) above 1e4,
# unscaled ones above float16's 65504, every product exact in float16 and bfloat16.
OPPOSITE_SIZES = ((40.0, 64), (64.0, 16))
KEY_SIGNS = (1.0, 0.75, 0.5, 0.25, -0.25, -0.5, -0.75, -1.0)  # distinct scores, 3200 apart or more


def _mask(pattern: str, shape: tuple[int, int, int], g: torch.Generator) -> torch.Tensor:
    batch, heads, seq = shape
    rand = functools.partial(torch.rand, generator=g)
    eye = torch.eye(seq, dtype=torch.bool)
    if pattern == "causal":
        mask = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, heads, seq, seq)
    elif pattern == "key padding":  # per sequence, the keys past its length
        lengths = torch.randint(1, seq + 1, (batch,), generator=g)
        keys = torch.arange(seq) < lengths[:, None]
        mask = keys[:, None, None, :].expand(batch, heads, seq, seq)
    elif pattern == "sliding window":
        i = torch.arange(seq)
        mask = ((i[:, None] - i[None, :]).abs() <= 2).expand(batch, heads, seq, seq)
    elif pattern == "one open key per row":
        mask = torch.zeros(batch, heads, seq, seq, dtype=torch.bool)
        mask.scatter_(-1, torch.randint(0, seq, (batch, heads, seq, 1), generator=g), True)
    else:
        mask = (rand((batch, heads, seq, seq)) < 0.4) | eye
        padded = rand((batch, heads, seq)) < 0.25
        padded[0, 0, -1] = True  # one at least
        mask[padded] = False  # padded queries see nothing
    return mask.clone()


def _drawn_cases(seed: int) -> tuple[Case, ...]:
    """The drawn inputs: each mask pattern of MASKS on its own drawn shape (batch, heads, seq,
    head_dim) with ordinary values, and the opposite-sign entries of lesson 13 on each of
    OPPOSITE_SIZES."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    found = []
    for pattern in MASKS:
        batch, heads = rng.randint(1, 3), rng.randint(1, 4)
        seq, dim = rng.randint(3, 20), rng.choice((8, 16, 32, 64, 80))

        q, k, v = (torch.randn((batch, heads, seq, dim), generator=g).half().float()
                   for _ in range(3))
        found.append(Case(f"{pattern}, shape {batch}x{heads}x{seq}x{dim}", q, k, v,
                          _mask(pattern, (batch, heads, seq), g), ORDINARY))
    for entry, dim in OPPOSITE_SIZES:
        found.append(_opposite_case(rng, g, entry, dim))
    return tuple(found)


def _opposite_case(rng: random.Random, g: torch.Generator, entry: float, dim: int) -> Case:
    """Query rows of +-entry everywhere, key j of KEY_SIGNS[j] * entry: scores of opposite
    signs, 0.25 * entry**2 * sqrt(dim) apart or more. Each row opens a drawn set of keys, or
    only its lowest-scoring one (every other key scores above it, the masked ones too), or none.
    """
    batch, heads, seq = rng.randint(1, 2), rng.randint(1, 3), len(KEY_SIGNS)
    signs = torch.randint(0, 2, (batch, heads, seq, 1), generator=g).float() * 2 - 1
    q = (entry * signs).expand(batch, heads, seq, dim).clone()
    k = (entry * torch.tensor(KEY_SIGNS))[:, None].expand(batch, heads, seq, dim).clone()
    v = torch.randn((batch, heads, seq, dim), generator=g).half().float()
    lowest = torch.where(signs > 0, seq - 1, 0).long()  # the key each row scores lowest
    mask = torch.rand((batch, heads, seq, seq), generator=g) < 0.5
    only = torch.rand((batch, heads, seq, 1), generator=g) < 0.6
    mask = torch.where(only, torch.zeros_like(mask).scatter(-1, lowest, True), mask)
    mask[..., 0, :] = False  # one fully masked row
    mask[..., 1, :] = torch.zeros(batch, heads, seq, dtype=torch.bool).scatter(
        -1, lowest[..., 1, :], True)  # one row that opens only its lowest-scoring key
    return Case(f"opposite-sign scores of +-{entry ** 2 * dim ** 0.5:.0f}, shape "
                f"{batch}x{heads}x{seq}x{dim}", q, k, v, mask, OPPOSITE)


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
    reference_error: float = math.inf  # the worst difference from the reference answer's output

    @property
    def matched(self) -> bool:
        """The reference answer's result: v's dtype, and every row within its allowance."""
        return (self.run.error is None and self.problem is None
                and self.dtype == self.scenario.dtype
                and self.reference_error <= _reference_atol(self.scenario, self.case))


def _reference_atol(scenario: Scenario, case: Case) -> float:
    """How far from the reference answer's output a right one may be here (REFERENCE_ATOL)."""
    if case.kind == LARGE and scenario.dtype == torch.float32:
        return REFERENCE_ATOL[torch.float16]
    return REFERENCE_ATOL[scenario.dtype]


def _worst(out: torch.Tensor, expected: torch.Tensor, rows: torch.Tensor) -> float:
    """The largest absolute difference over ``rows``; inf if ``out`` is not finite there."""
    if not rows.any():
        return 0.0
    diff = (out[rows] - expected[rows]).abs()
    return math.inf if not diff.isfinite().all() else diff.max().item()


def _atol(outcome: Outcome) -> float:
    """How far from float64 a right answer may be for this input (see ATOL)."""
    if outcome.scenario.dtype == torch.bfloat16:
        return REFERENCE_ATOL[torch.bfloat16]
    if outcome.case.kind in (ORDINARY, OPPOSITE):
        return ATOL[outcome.scenario.dtype]
    return ATOL[torch.float16]


@functools.cache
def _reference(scenario: Scenario, case: Case) -> torch.Tensor:
    """The reference answer's output on the scenario's inputs, called as the learner's is."""
    q, k, v = (t.to(scenario.dtype, copy=True) for t in (case.q, case.k, case.v))
    run, _ = _call(reference_answer, scenario.autocast, q, k, v, case.mask.clone())
    return run.value.detach().double()


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
    reference = _reference(outcome.scenario, case)
    outcome.reference_error = _worst(out, reference, torch.ones_like(has_open))
    atol = _atol(outcome)
    if _worst(out, reference, has_open) <= _reference_atol(outcome.scenario, case):
        pass  # the open rows are the reference answer's, however computed
    elif outcome.error <= LOW_PRECISION_ATOL and outcome.scenario.dtype != torch.bfloat16:
        # a wrong output dtype is named as such (rounding the output shows this way too)
        outcome.open_rows = "low precision" if value.dtype == outcome.scenario.dtype else "right"
    else:
        both = has_open & (~mask).any(-1)  # rows open under the mask and under its inverse
        if _worst(out, case.inverted, both) < min(NEAR, _worst(out, case.expected, both) / 4):
            outcome.open_rows = "inverted"
        elif _worst(out, case.wrong_axis, has_open) < atol:
            outcome.open_rows = "wrong axis"
        elif case.kind == ORDINARY and _worst(out, case.without_scale, has_open) < NEAR:
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
    worst = max(o.reference_error for o in wrong)
    allowed = ", ".join(dict.fromkeys(
        f"{str(o.scenario.dtype).removeprefix('torch.')} "
        f"{_reference_atol(o.scenario, o.case):g}" for o in wrong))
    how = "has NaN or inf" if math.isinf(worst) else f"differs from a right answer's output " \
        f"on the same inputs by up to {worst:.3g} (right answers stay within {allowed})"
    return _at(Problem.named(
        NOT_LIKE_REFERENCE, f"Your output {how} ({_where(wrong)}).", "Each query's output is "
        "the softmax over its open keys of q.k / "
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
    if opposite := [o for o in wrong if o.case.kind == OPPOSITE]:
        return _at(Problem.named(
            FILL_NOT_LOW_ENOUGH, f"On lesson 13's opposite-sign entries ({_where(opposite)}) "
            "your output gave masked keys weight: a query whose only open key scores lowest "
            "did not get that key's value.", "A fixed fill such as -1e4 (in masked_fill, "
            "torch.where or an additive mask) is not below every score: scores here reach "
            "-12800 for the open key and +12800 for masked ones, so a masked key filled with "
            "-1e4 still outscores the open key and softmax gives it the weight. Small scores "
            "hide this; large activations do not.", "fill with float('-inf') or "
            "torch.finfo(scores.dtype).min (then set fully masked rows to zero), or pass the "
            "boolean mask to F.scaled_dot_product_attention."), opposite)
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
    ordinary = [o for o in wrong if o.case.kind == ORDINARY]
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
    masked rows. Takes a few seconds on a laptop CPU (about 2.5 s here), more the first time in
    a process (fake tensors import ``torch._dynamo``, outside the learner's time limit).
    """
    outcomes: list[Outcome] = []
    for scenario in SCENARIOS:
        for case in make_cases():
            outcomes.append(_run(fn, scenario, case))
            if outcomes[-1].run.ends_check:
                break  # one endless loop, or one stub's error, is enough to report
        if outcomes[-1].run.ends_check:
            break
    found: dict[Scenario, list[Problem]] = {s: [] for s in SCENARIOS}
    for scenario, problem in _value_problems(outcomes):
        found[scenario].append(problem)
    unmatched = [o for o in outcomes if not o.matched and o.dtype == o.scenario.dtype]
    if unmatched and not any(found.values()) and not any(o.left or o.run.error is not None
                                                         or o.problem for o in outcomes):
        for scenario, problem in _not_like_reference(unmatched):  # nothing else explains it
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
    ended = any(o.run.ends_check for o in outcomes)
    if outcomes and all(o.matched for o in outcomes):  # the reference's result everywhere
        found = {s: [p for p in problems if p.key not in RESULT_KEYS]
                 for s, problems in found.items()}
    named = [(s.name, problems) for s, problems in found.items()]
    grad = [] if ended else _grad_problems(fn)
    devices = [] if ended else [(simulated_name(d), _simulated_problems(fn, d))
                                    for d in SIMULATED_DEVICE_TYPES]
    return EXERCISE.report([*named, ("float32, q requires grad", grad), *devices])


# What only describes a result: where the result is the reference answer's on every input, none
# of these rejects the answer (another spelling of the same attention is right).
RESULT_KEYS = frozenset({
    LOW_PRECISION_MATH, NOT_LIKE_REFERENCE, MISSING_SCALE, MASK_INVERTED, WRONG_AXIS,
    FULLY_MASKED_NAN, FULLY_MASKED_NOT_ZERO, SCORES_OVERFLOW, SOFTMAX_OVERFLOWS,
    FP32_UNDONE_BY_AUTOCAST, FILL_NOT_LOW_ENOUGH})
