"""check_masked_attention: every listed mistake is named, and every correct spelling passes.

``attention()`` builds masked attention step by step; with its defaults it is right (scores in
float32 outside autocast, -inf fill, fully masked rows set to zero, the result in v's dtype). Each
wrong case changes one thing, so the checker must report that mistake's key and nothing else (and
RAISED where torch itself refuses the mistake). The facts the messages state are probed at the end.
"""

from __future__ import annotations

import math
import runpy
from collections.abc import Callable
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from amp_tutorial.exercises import checking
from amp_tutorial.exercises import masked_attention as exercise
from amp_tutorial.exercises.masked_attention import check_masked_attention
from tests.support import SOLUTIONS
from tests.support.exercises import answers, checker_tests, named_twice, problem_keys

SOLUTION = SOLUTIONS / "masked_attention.py"
reference_solution = runpy.run_path(str(SOLUTION))["masked_attention"]


# -- the attention builder -------------------------------------------------------------------------
def attention(
    *,
    scores: str = "fp32",  # "fp32" (autocast off, float32), "scale q first" (input dtype),
    # "scale after" (input dtype), "float() in autocast" (.float(), autocast left on) or
    # "fp32, cpu only" (autocast off for "cpu" whatever the inputs' device)
    scale: bool = True,
    fill: str = "-inf",  # "-inf", "finfo" (of the scores' dtype), "-1e9", "-1e4", "finfo32" or
    # "where -1e9" (torch.where(mask, scores, -1e9))
    invert: bool = False,
    zero_rows: str | None = "where",  # "where", "multiply", "nan_to_num" or None
    softmax: str = "torch",  # "torch", "naive" (exp / sum in the scores' dtype), "naive fp32",
    # "max subtracted" (exp(s - max) / sum by hand) or "dim -2"
    out_dtype: str = "v",  # "v" (cast back to v.dtype), "keep" or "half"
    returns: str = "output",  # "output", "weights" or "transposed"
) -> Callable[..., torch.Tensor]:
    """A ``masked_attention`` built from the options; the defaults make a right one."""
    def masked_attention(q, k, v, mask):
        keep = ~mask if invert else mask
        off_for = {"fp32": q.device.type, "fp32, cpu only": "cpu"}.get(scores)
        in_fp32 = (lambda: torch.autocast(off_for, enabled=False)) if off_for else nullcontext
        s = q.shape[-1] ** -0.5 if scale else 1.0
        with in_fp32():
            if off_for:
                w = q.float() @ k.float().transpose(-2, -1) * s
            elif scores == "scale q first":
                w = (q * s) @ k.transpose(-2, -1)
            elif scores == "scale after":
                w = q @ k.transpose(-2, -1) * s
            else:
                assert scores == "float() in autocast", scores
                w = q.float() @ k.float().transpose(-2, -1) * s
        with in_fp32():
            if fill == "where -1e9":
                w = torch.where(keep, w, -1e9)
            else:
                value = {"-inf": float("-inf"), "finfo": torch.finfo(w.dtype).min, "-1e9": -1e9,
                         "finfo32": torch.finfo(torch.float32).min, "-1e4": -1e4}[fill]
                w = w.masked_fill(~keep, value)
            if softmax == "torch":
                w = w.softmax(-1)
            elif softmax == "dim -2":
                w = w.softmax(-2)
            elif softmax == "max subtracted":
                e = (w - w.amax(-1, keepdim=True)).exp()
                w = e / e.sum(-1, keepdim=True)
            else:
                e = (w.float() if softmax == "naive fp32" else w).exp()
                w = e / e.sum(-1, keepdim=True)
            any_open = keep.any(-1, keepdim=True)
            if zero_rows == "where":
                w = torch.where(any_open, w, 0.0)
            elif zero_rows == "multiply":
                w = w * any_open
            elif zero_rows == "nan_to_num":
                w = w.nan_to_num(0.0)
            if returns == "weights":
                return w
            out = w @ (v.float() if off_for or scores == "float() in autocast" else v)
        if returns == "transposed":
            out = out.transpose(1, 2)
        return {"v": out.to(v.dtype), "keep": out, "half": out.half()}[out_dtype]

    return masked_attention


def sdpa_alone(q, k, v, mask):
    """SDPA with nothing around it: on the CPU it returns zeros for fully masked rows itself."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def hand_written_einsum(q, k, v, mask):
    """Right, written differently: einsum, the scale split over q and k, an additive float mask
    in float32 and nan_to_num on the output."""
    with torch.autocast(q.device.type, enabled=False):
        d = q.shape[-1]
        scores = torch.einsum("bhqd,bhkd->bhqk", q.float() / d**0.25, k.float() / d**0.25)
        bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        out = torch.einsum("bhqk,bhkd->bhqd", (scores + bias).softmax(-1), v.float())
    return out.nan_to_num(0.0).to(v.dtype)


def bmm_heads(q, k, v, mask):
    """Right, written differently: batch and heads flattened into one bmm, in float32."""
    b, h, s, d = q.shape
    with torch.autocast(q.device.type, enabled=False):
        flat = [t.float().reshape(b * h, s, -1) for t in (q, k, v)]
        scores = torch.bmm(flat[0], flat[1].transpose(1, 2)) / math.sqrt(d)
        open_ = mask.reshape(b * h, s, -1)
        weights = scores.masked_fill(~open_, torch.finfo(torch.float32).min).softmax(-1)
        out = torch.bmm(weights * open_.any(-1, keepdim=True), flat[2])
    return out.reshape(b, h, s, -1).to(v.dtype)


def sdpa_additive_mask(q, k, v, mask):
    """Right: SDPA with a float mask (0 open, -inf masked), NaN rows set to 0 afterwards."""
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).nan_to_num(0.0)


def scales_q_in_place(q, k, v, mask):
    """Right values, wrong by a side effect (issue 28): q is scaled in place, so the caller's q
    changes and a q that requires grad raises; SDPA's own scale is switched off."""
    q.mul_(q.shape[-1] ** -0.5)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    return out.masked_fill(~mask.any(-1, keepdim=True), 0.0)


# -- one mistake each ------------------------------------------------------------------------------
# (case, the function, the key the checker must report, whether torch also raises)
def in_bfloat16(q, k, v, mask):
    out = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), attn_mask=mask)
    return torch.where(mask.any(-1, keepdim=True), out, 0.0).to(v.dtype)


def in_float16(q, k, v, mask):
    out = F.scaled_dot_product_attention(q.half(), k.half(), v.half(), attn_mask=mask)
    return torch.where(mask.any(-1, keepdim=True), out, 0.0).to(v.dtype)


def zeroed_by_key_column(q, k, v, mask):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.where(mask.any(-2).unsqueeze(-1), out, 0.0)


def additive_minus_1e4(q, k, v, mask):
    """A mask fill that fits float16 (issue 44): -1e4 added to masked scores, in float32."""
    with torch.autocast(q.device.type, enabled=False):
        bias = torch.zeros(mask.shape).masked_fill(~mask, -1e4)
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias)
    return torch.where(mask.any(-1, keepdim=True), out, 0.0).to(v.dtype)


def scale_for_head_dim_64(q, k, v, mask):
    """1/8 written in: right for the fixed inputs' head_dim of 64 only."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    return torch.where(mask.any(-1, keepdim=True), out, 0.0)


MISTAKES = [
    ("masked_fill(-1e9) on float16 scores", attention(scores="scale q first", fill="-1e9"),
     exercise.FILL_OVERFLOWS, True),
    ("masked_fill(finfo(float32).min) on float16 scores",
     attention(scores="scale q first", fill="finfo32"), exercise.FILL_OVERFLOWS, True),
    ("where(mask, scores, -1e9) on float16, rows zeroed by multiplying",
     attention(scores="scale q first", fill="where -1e9", zero_rows="multiply"),
     exercise.FILL_OVERFLOWS, False),
    ("-inf fill, fully masked rows left alone", attention(zero_rows=None),
     exercise.FULLY_MASKED_NAN, False),
    ("-inf fill, fully masked rows multiplied by 0", attention(zero_rows="multiply"),
     exercise.FULLY_MASKED_NAN, False),
    ("finfo(dtype).min fill, fully masked rows left alone",
     attention(fill="finfo", zero_rows=None), exercise.FULLY_MASKED_NOT_ZERO, False),
    ("scaled after the float16 matmul", attention(scores="scale after"),
     exercise.SCORES_OVERFLOW, False),
    (".float() inside autocast, scaled after", attention(scores="float() in autocast"),
     exercise.FP32_UNDONE_BY_AUTOCAST, False),
    ("softmax by hand in float16", attention(scores="scale q first", softmax="naive"),
     exercise.SOFTMAX_OVERFLOWS, False),
    ("softmax by hand in float32", attention(softmax="naive fp32"),
     exercise.SOFTMAX_OVERFLOWS, False),
    ("float32 scores with autocast off for the CPU only", attention(scores="fp32, cpu only"),
     exercise.OTHER_DEVICE, False),
    ("no 1/sqrt(d) scale", attention(scale=False), exercise.MISSING_SCALE, False),
    ("mask inverted", attention(invert=True), exercise.MASK_INVERTED, False),
    ("float32 returned for float16", attention(out_dtype="keep"), exercise.WRONG_DTYPE, False),
    ("float16 returned for float32", attention(out_dtype="half"), exercise.WRONG_DTYPE, False),
    ("returns the weights", attention(returns="weights"), exercise.WRONG_SHAPE, False),
    ("returns (batch, seq, heads, dim)", attention(returns="transposed"), exercise.WRONG_SHAPE,
     False),
    ("softmax over the queries", attention(softmax="dim -2"), exercise.NOT_LIKE_REFERENCE,
     False),
    ("q scaled in place", scales_q_in_place, checking.INPUT_CHANGED, False),
    ("computed in bfloat16, returned in v's dtype", in_bfloat16, exercise.LOW_PRECISION_MATH,
     False),
    ("float32 inputs computed in float16", in_float16, exercise.LOW_PRECISION_MATH, False),
    ("fully masked rows found with mask.any(-2)", zeroed_by_key_column, exercise.WRONG_AXIS,
     False),
    ("returns a list", lambda q, k, v, mask: attention()(q, k, v, mask).tolist(),
     checking.WRONG_RETURN, False),
    ("masked_fill(-1e4) on float32 scores", attention(fill="-1e4"),
     exercise.FILL_NOT_LOW_ENOUGH, False),
    ("masked_fill(-1e4) on float16 scores, q scaled first",
     attention(scores="scale q first", fill="-1e4"), exercise.FILL_NOT_LOW_ENOUGH, False),
    ("an additive -1e4 mask in float32", additive_minus_1e4, exercise.FILL_NOT_LOW_ENOUGH,
     False),
    ("scale 1/8 written in for head_dim 64", scale_for_head_dim_64,
     exercise.NOT_LIKE_REFERENCE, False),
]
WRONG = answers(MISTAKES)


def test_messages_name_the_setting_and_the_fix() -> None:
    text = str(check_masked_attention(WRONG["scaled after the float16 matmul"]))
    assert "[float16; float16 under autocast]" in text and "65504" in text
    text = named_twice(check_masked_attention, WRONG[".float() inside autocast, scaled after"])
    assert "[float16 under autocast]" in text and "enabled=False" in text
    text = named_twice(check_masked_attention,
                       WRONG["float32 scores with autocast off for the CPU only"])
    assert "[simulated cuda (float16); simulated xpu (float16); simulated mps (float16)]" in text
    assert 'device_type "cpu"' in text and "q.device.type" in text
    raised = str(check_masked_attention(WRONG["masked_fill(-1e9) on float16 scores"]))
    assert exercise.OVERFLOW_ERROR in raised  # torch's own words, quoted in the message too


def test_checker_leaves_torch_unpatched() -> None:
    sdpa, softmax = F.scaled_dot_product_attention, torch.Tensor.softmax

    def switches_autocast_on(q, k, v, mask):
        torch.set_autocast_enabled("cpu", True)
        torch.set_autocast_dtype("cpu", torch.float16)
        return reference_solution(q, k, v, mask)

    check_masked_attention(switches_autocast_on)
    assert F.scaled_dot_product_attention is sdpa and torch.Tensor.softmax is softmax
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16


# -- correct spellings -----------------------------------------------------------------------------
CORRECT = {
    "reference solution: SDPA, then torch.where on fully masked rows": reference_solution,
    "SDPA alone (zeros for fully masked rows on the CPU)": sdpa_alone,
    "float32 scores, finfo(scores.dtype).min fill, torch.where": attention(fill="finfo"),
    "float32 scores, -inf fill, nan_to_num on the weights": attention(zero_rows="nan_to_num"),
    "q scaled first in float16, -inf fill, torch.where": attention(scores="scale q first"),
    "q scaled first, finfo(float16).min fill, softmax by hand minus the max": attention(
        scores="scale q first", fill="finfo", softmax="max subtracted"),
    "einsum, additive float32 mask, nan_to_num on the output": hand_written_einsum,
    "float32 scores, -1e9 fill (below every float32 score here), torch.where":
        attention(fill="-1e9"),
    "heads flattened into bmm, finfo(float32).min fill": lambda q, k, v, mask: bmm_heads(
        q, k, v, mask),
    "SDPA with an additive float mask of -inf, nan_to_num": sdpa_additive_mask,
}


test_each_mistake_is_named, test_every_problem_key_has_a_case, test_correct_answers_pass = (
    checker_tests(check_masked_attention, MISTAKES,
                  problem_keys(exercise, exercise.DEVICE_TYPE, exercise.PRAISE,
                               exercise.OVERFLOW_ERROR, exercise.RANDOM, exercise.CAUSAL,
                               exercise.MID, exercise.LARGE, exercise.ORDINARY,
                               exercise.OPPOSITE),
                  CORRECT, exercise.PRAISE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_the_tolerance_leaves_room_both_ways(dtype: torch.dtype) -> None:
    """Right answers stay well inside the dtype's ATOL; math in fewer bits than the inputs have
    (bfloat16 for float16 inputs, float16 for float32 ones) is outside it, and the mistakes
    judged by value are far outside even LOW_PRECISION_ATOL."""
    worst_right = max(_worst_error(fn, dtype) for fn in CORRECT.values())
    assert worst_right < exercise.ATOL[dtype] / 2
    fewer_bits = in_float16 if dtype == torch.float32 else in_bfloat16
    assert exercise.ATOL[dtype] * 1.5 < _worst_error(fewer_bits, dtype)
    assert _worst_error(fewer_bits, dtype) < exercise.LOW_PRECISION_ATOL / 2
    for name in ("no 1/sqrt(d) scale", "softmax over the queries"):
        assert _worst_error(WRONG[name], dtype) > 10 * exercise.LOW_PRECISION_ATOL, name


def _worst_error(fn: Callable[..., torch.Tensor], dtype: torch.dtype) -> float:
    """The largest error on the inputs whose allowance is the dtype's own (ATOL)."""
    worst = 0.0
    for scenario in exercise.SCENARIOS:
        if scenario.dtype != dtype:
            continue
        for case in exercise.make_cases()[:2]:  # random and causal masks
            outcome = exercise._run(fn, scenario, case)
            worst = max(worst, outcome.error)
    return worst


def test_the_reference_beside_lets_right_answers_in_and_fewer_bits_out() -> None:
    """On every input, right spellings stay within REFERENCE_ATOL of the reference answer's
    output run beside them (measured: float32 5.4e-7 but 2.5e-4 on the fixed large-score input,
    which keeps float16's allowance; float16 1.95e-3; bfloat16 1.6e-2); math in fewer bits than
    the inputs have is outside it on the ordinary inputs (measured: 6.9e-4 and 6.8e-3 or more)."""
    for scenario in exercise.SCENARIOS:
        for case in exercise.make_cases():
            allowed = exercise._reference_atol(scenario, case)
            for name, fn in CORRECT.items():
                outcome = exercise._run(fn, scenario, case)
                assert outcome.matched and outcome.reference_error <= allowed, (
                    name, scenario.name, case.name, outcome.reference_error)
            fewer_bits = {torch.float32: in_float16, torch.float16: in_bfloat16}.get(
                scenario.dtype)
            if fewer_bits and case.kind == exercise.ORDINARY and case.mask.sum(-1).max() > 1:
                assert exercise._run(fewer_bits, scenario, case).reference_error > 1.5 * allowed


def test_the_drawn_inputs_exercise_every_rule_and_repeat() -> None:
    """Shapes other than the fixed inputs' (batch, heads, seq, head_dim all vary), each mask
    pattern, fully masked rows, rows whose one open key scores lowest below -1e4 while masked
    keys score above it (lesson 13's entries of 40), unscaled scores beyond float16, the same
    draw every time."""
    drawn = exercise._drawn_cases(exercise.DRAW_SEED)
    assert [c.name for c in drawn] == [c.name for c in exercise._drawn_cases(exercise.DRAW_SEED)]
    for axis in range(4):
        assert len({c.q.shape[axis] for c in drawn}) >= 2, axis
    assert [c.name.partition(", shape")[0] for c in drawn][:len(exercise.MASKS)] == list(
        exercise.MASKS)
    assert any((~c.mask.any(-1)).any() for c in drawn if c.kind == exercise.ORDINARY)
    opposite = [c for c in drawn if c.kind == exercise.OPPOSITE]
    assert len(opposite) == len(exercise.OPPOSITE_SIZES)
    for case in opposite:
        scores = case.q @ case.k.transpose(-2, -1) * case.q.shape[-1] ** -0.5
        assert (case.q @ case.k.transpose(-2, -1)).abs().max() > torch.finfo(torch.float16).max
        one_open = case.mask.sum(-1) == 1
        open_score = torch.where(case.mask, scores, float("inf")).amin(-1)
        masked_top = torch.where(case.mask, float("-inf"), scores).amax(-1)
        trap = one_open & (open_score < -1e4) & (masked_top > -1e4)
        assert trap[..., 1].all() and (~case.mask.any(-1)).any()
        assert torch.equal(case.q.half().float(), case.q) and torch.equal(
            case.k.bfloat16().float(), case.k)


def test_a_minus_1e4_fill_is_named_in_plain_words() -> None:
    text = str(check_masked_attention(WRONG["masked_fill(-1e4) on float32 scores"]))
    assert "float32;" in text and "opposite-sign" in text and "-1e4" in text
    assert "masked keys" in text and "12800" in text


# -- the inputs and the facts the messages state ---------------------------------------------------
def test_inputs_are_adversarial_and_repeatable() -> None:
    state = torch.random.get_rng_state()
    cases = {case.name: case for case in exercise.make_cases()}
    assert torch.equal(torch.random.get_rng_state(), state)
    large = cases[exercise.LARGE]
    unscaled = (large.q @ large.k.transpose(-2, -1)).abs().max().item()
    fp16_max = torch.finfo(torch.float16).max
    assert unscaled > fp16_max > unscaled / math.sqrt(exercise.HEAD_DIM)
    mid = cases[exercise.MID]
    assert (mid.q @ mid.k.transpose(-2, -1)).max().item() / 8 > math.log(fp16_max)
    fully = ~cases[exercise.RANDOM].mask.any(-1)
    assert fully.any() and not fully.all()
    for case in cases.values():
        assert torch.equal(case.q.half().float(), case.q)  # float16 holds every input exactly


def test_the_facts_in_the_messages() -> None:
    scores = torch.zeros(2, dtype=torch.float16)
    mask = torch.tensor([True, False])
    for value in (-1e9, torch.finfo(torch.float32).min):
        with pytest.raises(RuntimeError, match=exercise.OVERFLOW_ERROR):
            scores.masked_fill(mask, value)
        assert torch.where(mask, value, scores)[0] == float("-inf")  # silently -inf
    assert torch.finfo(torch.float16).min == -65504
    assert torch.tensor(11.1, dtype=torch.float16).exp().isinf()
    assert torch.tensor(11.08, dtype=torch.float16).exp().isfinite()
    assert torch.tensor(88.8).exp().isinf() and torch.tensor(88.7).exp().isfinite()
    nan_row = torch.full((3,), float("-inf")).softmax(-1)
    assert nan_row.isnan().all() and (nan_row * 0).isnan().all()
    assert torch.where(torch.tensor(False), nan_row, 0.0).eq(0).all()
    x = torch.randn(1000, 16, generator=torch.Generator().manual_seed(0)).mul(3).half()
    half_ulp_at_1 = torch.finfo(torch.float16).eps / 2
    assert (x.softmax(-1).float() - x.float().softmax(-1)).abs().max() <= half_ulp_at_1


def test_the_autocast_facts_in_the_messages() -> None:
    """CPU: matmul on the lower-precision list, softmax and exp on none; CUDA: all three on a
    list (matmul low precision, softmax and exp float32). Read from the dispatcher's registry and
    run on the CPU."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in ("aten::matmul", "aten::bmm", "aten::scaled_dot_product_attention"):
        assert has(op, "AutocastCPU") and has(op, "AutocastCUDA"), op
    for op in ("aten::softmax.int", "aten::exp"):
        assert not has(op, "AutocastCPU") and has(op, "AutocastCUDA"), op
    q = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.float16):
        assert (q.float() @ q.float().T).dtype == torch.float16
        assert q.half().softmax(-1).dtype == torch.float16 and q.softmax(-1).dtype == torch.float32


def test_sdpa_gives_zeros_for_fully_masked_rows_on_the_cpu() -> None:
    q = torch.randn(1, 1, 3, 8)
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    for dtype in (torch.float32, torch.float16):
        out = F.scaled_dot_product_attention(*(q.to(dtype),) * 3, attn_mask=mask)
        assert out[0, 0, 1].eq(0).all() and out.isfinite().all()
