"""check_contrastive_loss: every listed mistake is named, and every right spelling passes.

Each wrong answer below makes exactly one mistake, so the checker must report that mistake's key
and nothing else (RAISED may come with a mistake that makes torch raise). The checker watches the
code run (the autocast state at each torch call, the dtype each kernel ran in, the autocast
regions entered) and compares values and gradients with fp32, so differently spelled right
answers must all pass. The last tests probe, on this machine's torch, the facts the messages
state about autocast and the inputs.
"""

from __future__ import annotations

import functools
import runpy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode

from amp_tutorial.autocast_policy import (
    autocast_flags,
    fake_tensors,
    has_autocast_kernel,
    trace_dtypes,
)
from amp_tutorial.exercises import checking
from amp_tutorial.exercises import contrastive_loss as exercise
from amp_tutorial.exercises.contrastive_loss import check_contrastive_loss
from amp_tutorial.exercises.training_spy import simulated_name
from tests.support import SOLUTIONS
from tests.support.exercises import checker_tests, named_twice, problem_keys

SOLUTION = SOLUTIONS / "contrastive_loss.py"
reference_solution = runpy.run_path(str(SOLUTION))["contrastive_loss"]


def targets(queries: torch.Tensor) -> torch.Tensor:
    return torch.arange(len(queries), device=queries.device)


def fp32_loss(queries: torch.Tensor, keys: torch.Tensor, temperature: float,
              reduction: str = "mean") -> torch.Tensor:
    """The right math on tensors already in fp32, with autocast already off."""
    return F.cross_entropy(queries @ keys.T / temperature, targets(queries), reduction=reduction)


# -- one mistake each ------------------------------------------------------------------------------
def under_autocast(q, k, t):
    return F.cross_entropy(q @ k.T / t, targets(q))


def inputs_made_new_leaves(q, k, t):  # a blind learner's answer: on simulated MPS and XPU
    with torch.autocast(q.device.type, enabled=False):  # tensors it ended the process
        q = q.detach().float().requires_grad_()
        k = k.detach().float().requires_grad_()
        return F.cross_entropy(q @ k.T / t, targets(q))


def under_autocast_by_hand(q, k, t):  # the 16-bit logsumexp hands back a 16-bit loss too
    logits = q @ k.T / t
    return (logits.logsumexp(dim=1) - logits.diagonal()).mean()


def autocast_off_inputs_not_cast(q, k, t):
    with torch.autocast(device_type=q.device.type, enabled=False):
        return F.cross_entropy(q @ k.T / t, targets(q))


def cast_but_autocast_on(q, k, t):
    return fp32_loss(q.float(), k.float(), t)


def autocast_off_for_cuda(q, k, t):
    with torch.autocast(device_type="cuda", enabled=False):
        return fp32_loss(q.float(), k.float(), t)


def old_cuda_amp_autocast(q, k, t):
    with torch.cuda.amp.autocast(enabled=False):
        return fp32_loss(q.float(), k.float(), t)


@torch.autocast(device_type="cpu", enabled=False)
def decorator_for_cpu_only(q, k, t):
    return fp32_loss(q.float(), k.float(), t)


def cpu_or_cuda_only(q, k, t):
    with torch.autocast(device_type="cuda" if q.is_cuda else "cpu", enabled=False):
        return fp32_loss(q.float(), k.float(), t)


def cast_back_down(q, k, t):
    return reference_solution(q, k, t).to(q.dtype)


def float64_result(q, k, t):
    with torch.autocast(device_type=q.device.type, enabled=False):
        return fp32_loss(q.double(), k.double(), t)


def detached(q, k, t):
    return reference_solution(q, k, t).detach()


def keys_detached(q, k, t):
    return reference_solution(q, k.detach(), t)


def item(q, k, t):
    return reference_solution(q, k, t).item()


def summed(q, k, t):
    with torch.autocast(device_type=q.device.type, enabled=False):
        return fp32_loss(q.float(), k.float(), t, reduction="sum")


def per_pair(q, k, t):
    with torch.autocast(device_type=q.device.type, enabled=False):
        return fp32_loss(q.float(), k.float(), t, reduction="none")


def log_of_exp_sum(q, k, t):  # fp32 throughout, but exp overflows float32 above about 88.7
    with torch.autocast(device_type=q.device.type, enabled=False):
        logits = q.float() @ k.float().T / t
        return (torch.exp(logits).sum(dim=1).log() - logits.diagonal()).mean()


def temperature_forgotten(q, k, t):
    return reference_solution(q, k, 1.0)


def logsumexp_detached(q, k, t):
    with torch.autocast(device_type=q.device.type, enabled=False):
        logits = q.float() @ k.float().T / t
        return (logits.logsumexp(dim=1).detach() - logits.diagonal()).mean()


def returns_none(q, k, t):
    reference_solution(q, k, t)


def returns_a_tuple(q, k, t):
    return reference_solution(q, k, t), None


def targets_on_the_cpu(q, k, t):  # right on the CPU; a GPU raises (a device mismatch)
    with torch.autocast(device_type=q.device.type, enabled=False):
        return F.cross_entropy(q.float() @ k.float().T / t, torch.arange(len(q)))


# Mistakes that only the drawn scenarios show (issue 44): the four fixed ones are 16-bit inputs
# of 16 pairs inside autocast, with grad on.
def fp32_inputs_left_to_autocast(q, k, t):  # 16-bit math where fp32 was asked, for fp32 inputs
    if q.dtype == torch.float32:
        return F.cross_entropy(q @ k.T / t, targets(q))
    return reference_solution(q, k, t)


def fp32_only_under_autocast(q, k, t):  # with no autocast around the call, 16 bits as given
    if not torch.is_autocast_enabled(q.device.type):
        return F.cross_entropy(q @ k.T / t, targets(q)).float()
    return reference_solution(q, k, t)


def keeps_the_logits_gradient(q, k, t):  # raises under torch.no_grad(): nothing to retain
    with torch.autocast(device_type=q.device.type, enabled=False):
        logits = q.float() @ k.float().T / t
        logits.retain_grad()
        return F.cross_entropy(logits, targets(q))


def mean_over_16_pairs(q, k, t):  # the batch size of the fixed inputs, written in
    return reference_solution(q, k, t) * len(q) / 16 if len(q) != 16 else reference_solution(
        q, k, t)


def targets_for_16_pairs(q, k, t):
    with torch.autocast(device_type=q.device.type, enabled=False):
        return F.cross_entropy(q.float() @ k.float().T / t, torch.arange(16))


# (case, function, the key the checker must report, whether torch also raises)
MISTAKES = [
    ("computed under autocast unchanged", under_autocast, exercise.UNDER_AUTOCAST, False),
    ("16-bit logsumexp under autocast", under_autocast_by_hand, exercise.UNDER_AUTOCAST, False),
    ("autocast off, inputs not cast", autocast_off_inputs_not_cast, exercise.NOT_CAST, False),
    ("inputs cast, autocast still on", cast_but_autocast_on, exercise.AUTOCAST_STILL_ON, False),
    ("autocast off for 'cuda' on CPU tensors", autocast_off_for_cuda, exercise.OTHER_DEVICE,
     False),
    ("torch.cuda.amp.autocast(enabled=False)", old_cuda_amp_autocast, exercise.OTHER_DEVICE,
     False),
    ("@torch.autocast('cpu', enabled=False) on CUDA tensors", decorator_for_cpu_only,
     exercise.OTHER_DEVICE, False),
    ('autocast off for "cuda" or else "cpu": wrong on XPU and MPS', cpu_or_cuda_only,
     exercise.OTHER_DEVICE, False),
    ("result cast back down", cast_back_down, exercise.RESULT_DTYPE, False),
    ("float64 result", float64_result, exercise.RESULT_DTYPE, False),
    ("result detached", detached, exercise.GRAPH_BROKEN, False),
    ("keys detached", keys_detached, exercise.GRAPH_BROKEN, False),
    ("inputs detached, made leaves that require grad", inputs_made_new_leaves,
     exercise.GRAPH_BROKEN, False),
    (".item()", item, exercise.RETURNED_NUMBER, False),
    ("sum, not mean", summed, exercise.WRONG_REDUCTION, False),
    ("one loss per pair", per_pair, exercise.WRONG_REDUCTION, False),
    ("log(exp(...).sum()) in fp32", log_of_exp_sum, exercise.WRONG_VALUE, False),
    ("temperature forgotten", temperature_forgotten, exercise.WRONG_VALUE, False),
    ("logsumexp detached", logsumexp_detached, exercise.WRONG_GRADIENT, False),
    ("returns None", returns_none, checking.WRONG_RETURN, False),
    ("returns a tuple", returns_a_tuple, checking.WRONG_RETURN, False),
    ("targets made on the CPU", targets_on_the_cpu, checking.RAISED, True),
    ("float32 inputs left to the caller's autocast", fp32_inputs_left_to_autocast,
     exercise.UNDER_AUTOCAST, False),
    ("fp32 only when autocast is on", fp32_only_under_autocast, exercise.UNDER_AUTOCAST, False),
    ("retain_grad on the logits: raises under torch.no_grad()", keeps_the_logits_gradient,
     checking.RAISED, True),
    ("the sum divided by 16 whatever the batch size", mean_over_16_pairs, exercise.WRONG_VALUE,
     False),
    ("targets for 16 pairs whatever the batch size", targets_for_16_pairs, checking.RAISED,
     True),
]


def test_report_is_plain_words_and_names_the_numbers() -> None:
    first = str(check_contrastive_loss(under_autocast))
    assert "65504" in first and "enabled=False" not in first  # the fix waits for a second try
    text = named_twice(check_contrastive_loss, under_autocast)
    assert "65504" in text and "enabled=False" in text and ".float()" in text
    assert "[float16, large dot products; " in text  # the scenarios it was found in


def test_a_device_agnostic_mistake_shows_only_on_simulated_cuda() -> None:
    result = check_contrastive_loss(decorator_for_cpu_only)
    (problem,) = result.problems
    assert problem.message.startswith(
        f"[{'; '.join(map(simulated_name, exercise.SIMULATED_DEVICE_TYPES))}]")
    assert 'device_type "cpu"' in problem.message and '"cuda"' in problem.message


def test_the_deprecated_spelling_is_named() -> None:
    text = str(check_contrastive_loss(old_cuda_amp_autocast))
    assert "torch.cuda.amp.autocast" in text and "FutureWarning" in text


def test_checker_leaves_torch_unpatched() -> None:
    enter = torch.amp.autocast_mode.autocast.__enter__
    for fn in (reference_solution, autocast_off_for_cuda, targets_on_the_cpu, summed):
        check_contrastive_loss(fn)
    assert torch.amp.autocast_mode.autocast.__enter__ is enter
    assert not _get_current_function_mode_stack() and _get_current_dispatch_mode() is None
    assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")
    assert torch.get_autocast_dtype("cuda") == torch.float16  # the simulated run restores it


# -- right spellings -------------------------------------------------------------------------------
def amp_autocast_einsum_by_hand(queries, keys, temperature):
    with torch.amp.autocast(queries.device.type, enabled=False):
        q, k = queries.to(torch.float32), keys.to(torch.float32)
        logits = torch.einsum("id,jd->ij", q, k) / temperature
        return (torch.logsumexp(logits, dim=1) - logits.diagonal()).mean()


def decorated_per_call_in_float64(queries, keys, temperature):
    fp32_off = torch.autocast(device_type=queries.device.type, enabled=False)
    loss = fp32_off(fp32_loss)(queries.double(), keys.double(), temperature)
    return loss.float()


def cast_with_no_op_that_autocast_lowers(queries, keys, temperature):
    # mul and sum are on no CPU autocast list; on CUDA mul is on none and sum returns fp32
    q, k = queries.float(), keys.float()
    similarities = (q[:, None, :] * k[None, :, :]).sum(dim=-1)
    return F.cross_entropy(similarities / temperature, targets(q))


def log_softmax_diagonal_in_float64(queries, keys, temperature):
    with torch.autocast(device_type=queries.device.type, enabled=False):
        logits = queries.double() @ keys.double().mT / temperature
        return -logits.log_softmax(dim=1).diagonal().mean().float()


def custom_fwd_cast_inputs(queries, keys, temperature):
    return _Fp32Loss.apply(queries, keys, temperature)


class _Fp32Loss(torch.autograd.Function):
    """Lesson 07's own tool: custom_fwd(cast_inputs=float32) casts and turns autocast off."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, queries, keys, temperature):
        ctx.save_for_backward(queries, keys)
        ctx.temperature = temperature
        return fp32_loss(queries, keys, temperature)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        queries, keys = ctx.saved_tensors
        with torch.enable_grad():
            q, k = queries.detach().requires_grad_(), keys.detach().requires_grad_()
            dq, dk = torch.autograd.grad(fp32_loss(q, k, ctx.temperature), (q, k), grad)
        return dq, dk, None


CORRECT = {
    "reference: torch.autocast(..., enabled=False), .float(), @, F.cross_entropy":
        reference_solution,
    "torch.amp.autocast, .to(torch.float32), einsum, logsumexp by hand":
        amp_autocast_einsum_by_hand,
    "autocast as a decorator made per call, float64 inside, .float() at the end":
        decorated_per_call_in_float64,
    "inputs cast, autocast left on, no op on a lower-precision list":
        cast_with_no_op_that_autocast_lowers,
    "float64, log_softmax, the diagonal's mean": log_softmax_diagonal_in_float64,
}


test_each_mistake_is_named, test_every_problem_key_has_a_case, test_correct_answers_pass = (
    checker_tests(check_contrastive_loss, MISTAKES,
                  problem_keys(exercise, exercise.DEVICE_TYPE, exercise.PRAISE),
                  CORRECT, exercise.PRAISE))


def test_mistakes_only_the_drawn_scenarios_show_are_named_in_plain_words() -> None:
    text = str(check_contrastive_loss(fp32_only_under_autocast))
    assert "computed in 16 bits: with no autocast around the call" in text
    assert "[bfloat16 inputs, no autocast, drawn 3" in text and "float16, large" not in text
    text = str(check_contrastive_loss(fp32_inputs_left_to_autocast))
    assert "[float32 inputs, under float16 autocast, drawn 1" in text
    assert "autocast casting your float32 inputs down" in text
    text = str(check_contrastive_loss(keeps_the_logits_gradient))
    assert text.count("[") == 1 and "torch.no_grad()" in text and "retain_grad" in text


def test_the_drawn_scenarios_exercise_every_rule_and_repeat() -> None:
    """Batch sizes, widths and temperatures other than the fixed inputs'; float16, bfloat16 and
    float32 inputs; autocast of either dtype and none; a call under torch.no_grad(); the same
    draw every time; a loss that is neither ~0 nor overflowing, so every pair counts."""
    drawn = exercise._drawn_scenarios()
    assert [s.name for s in drawn] == [s.name for s in exercise._drawn_scenarios()]
    assert {s.dtype for s in drawn} == {torch.float16, torch.bfloat16, torch.float32}
    assert {s.amp_dtype for s in drawn} == {torch.float16, torch.bfloat16, None}
    assert any(s.no_grad for s in drawn) and not all(s.no_grad for s in drawn)
    assert len({len(s.case.queries) for s in drawn} - {exercise.N_PAIRS}) >= 3
    assert len({s.case.temperature for s in drawn}) >= 3
    assert any(s.dtype == torch.float32 and s.amp_dtype for s in drawn)  # autocast casts down
    for s in drawn:
        loss = exercise.reference_loss(s.case.queries, s.case.keys, s.case.temperature)
        assert 0.1 < loss < 30, s.name
        for dtype in exercise.LOW:
            assert torch.equal(s.case.queries.to(dtype).float(), s.case.queries)


def test_the_tolerance_lets_right_answers_in_and_16_bit_math_out() -> None:
    """On every scenario the right spellings stay within TOLERANCE / 10 of the reference
    answer's loss (relative to the largest logit; measured: 6.3e-8), and the same loss computed
    in float16 is outside TOLERANCE * 10 (measured: 2.4e-5 or more, or not finite)."""
    for scenario in exercise.SCENARIOS:
        case = scenario.case
        reference = exercise._reference(scenario)[0]
        for fn in CORRECT.values():
            q, k = exercise._inputs(case, scenario.dtype)
            with exercise._caller(scenario):
                value = fn(q, k, case.temperature)
            assert abs(value - reference) < case.tolerance / 10, scenario.name
        q, k = exercise._inputs(case, scenario.dtype)
        with exercise._caller(scenario):
            fp16 = fp32_loss(q.half(), k.half(), case.temperature).float()
        assert not abs(fp16 - reference) < 10 * case.tolerance, scenario.name


# -- the inputs and the facts the messages state ---------------------------------------------------
def test_cases_are_repeatable_exact_in_16_bits_and_leave_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    first, second = exercise.make_cases(), exercise.make_cases()
    assert torch.equal(torch.random.get_rng_state(), state)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.queries, b.queries) and torch.equal(a.keys, b.keys)
        for x in (a.queries, a.keys):
            for dtype in exercise.LOW:
                assert torch.equal(x.to(dtype).float(), x)


def test_the_inputs_break_16_bit_math_and_not_fp32() -> None:
    """What the messages and make_cases say, measured: float16 overflows on the first input,
    and 16-bit rounding misses by far more than RTOL on every input, in both dtypes."""
    large, small = exercise.CASES
    dots = large.queries @ large.keys.T
    assert dots.abs().max() > torch.finfo(torch.float16).max  # "above 65504"
    assert 90_000 < dots.abs().max() < 100_000  # "about 99,000"
    assert 3e5 < exercise.reference_loss(large.queries, large.keys, large.temperature) < 5e5
    parts = small.queries @ small.keys.T - 256
    assert small.queries[0, 0] == 16 and parts.abs().max() < 2  # 256 plus a small part
    for dtype in exercise.LOW:
        assert 256 * torch.finfo(dtype).eps == {torch.float16: 0.25, torch.bfloat16: 2}[dtype]
        for case in exercise.CASES:
            q, k = case.queries.to(dtype), case.keys.to(dtype)
            reference = exercise.reference_loss(q, k, case.temperature)
            right = [fn(q, k, case.temperature) for fn in CORRECT.values()]
            assert all(abs(r - reference) < case.tolerance / 10 for r in right)
            with torch.autocast("cpu", dtype=dtype):
                naive = under_autocast(q, k, case.temperature).float()
            if dtype == torch.float16 and case is large:
                assert not naive.isfinite()
            else:
                assert abs(naive - reference) > 10 * case.tolerance
                assert abs(naive - reference) > 1e-3 * reference  # "by 1e-3 ... of the loss"


LOWERED = {  # the ops the messages name as lowered, with fp32 inputs
    "mm": lambda a: a @ a.T, "bmm": lambda a: torch.bmm(a[None], a.T[None]),
    "addmm": lambda a: torch.addmm(a[:, :4], a, a.T[:, :4]), "matmul": lambda a: a.matmul(a.T),
    "linear": lambda a: F.linear(a, a), "einsum": lambda a: torch.einsum("id,jd->ij", a, a)}
KEPT = {"exp": torch.exp, "log": lambda a: a.abs().log(), "sum": torch.sum,
        "logsumexp": lambda a: a.logsumexp(1)}


@pytest.mark.parametrize("dtype", exercise.LOW, ids=str)
def test_cpu_autocast_lowers_matmuls_and_keeps_exp_log_sum(dtype: torch.dtype) -> None:
    a = torch.randn(8, 8)
    with torch.autocast("cpu", dtype=dtype):
        assert {name: f(a).dtype for name, f in LOWERED.items()} == dict.fromkeys(LOWERED, dtype)
        assert {name: f(a).dtype for name, f in KEPT.items()} == dict.fromkeys(KEPT, a.dtype)
        low = a.to(dtype)
        assert {name: f(low).dtype for name, f in KEPT.items()} == dict.fromkeys(KEPT, dtype)
        with torch.autocast("cpu", enabled=False):  # casts nothing: 16-bit in, 16-bit out
            assert (low @ low.T).dtype == dtype
        for other in (torch.autocast("cuda", enabled=False), torch.amp.autocast("cuda",
                                                                                 enabled=False)):
            with other:  # the "cuda" switch only: the "cpu" autocast stays on
                assert torch.is_autocast_enabled("cpu") and (a @ a.T).dtype == dtype


def test_cuda_autocast_lowers_matmuls_too_on_fake_tensors() -> None:
    with fake_tensors():
        a = torch.empty(8, 8, device="cuda")
        with autocast_flags("cuda", torch.float16):
            assert {name: f(a).dtype for name, f in LOWERED.items()} == dict.fromkeys(
                LOWERED, torch.float16)
            assert torch.exp(a).dtype == torch.float32 and a.sum().dtype == torch.float32
        with autocast_flags("cuda", torch.float16, enabled=False):
            low = a.half()
            assert (low @ low.T).dtype == torch.float16


def test_the_naive_loss_takes_cudas_own_path_and_still_breaks() -> None:
    """fp16 mode is not CUDA's path for the naive loss (gpu-register.md, lesson 07): the CPU has
    an fp32 rule for cross_entropy_loss, CUDA none; cross_entropy_loss calls log_softmax with the
    logits' dtype (LossNLL.cpp), so CUDA's fp32_set_opt_dtype rule leaves the log-probabilities
    in float16 and only nll_loss runs in fp32. CUDA's dtypes, on the CPU's kernels, still break
    the loss on both inputs."""
    assert has_autocast_kernel("aten::cross_entropy_loss", "cpu")
    assert not has_autocast_kernel("aten::cross_entropy_loss", "cuda")
    ran = {}
    for device in ("cpu", "cuda"):
        with fake_tensors(), autocast_flags(device, torch.float16):
            q, k = (torch.empty(16, 32, device=device, dtype=torch.float16) for _ in range(2))
            ops = trace_dtypes(functools.partial(under_autocast, q, k, 1))
        ran[device] = {op.op: op.output for op in ops
                       if op.op in ("mm", "_log_softmax", "nll_loss_forward")}
    assert ran == {"cpu": {"mm": "fp16", "_log_softmax": "fp32", "nll_loss_forward": "fp32"},
                   "cuda": {"mm": "fp16", "_log_softmax": "fp16", "nll_loss_forward": "fp32"}}
    large = exercise.CASES[0]
    for case in exercise.CASES:
        q, k = case.queries.half(), case.keys.half()
        with torch.autocast("cpu", dtype=torch.float16):
            logits = q @ k.T / case.temperature
        cuda_path = F.nll_loss(F.log_softmax(logits, 1, dtype=torch.float16).float(), targets(q))
        reference = exercise.reference_loss(q, k, case.temperature)
        if case is large:
            assert not cuda_path.isfinite()  # inf logits, NaN loss, as in fp16 mode
        else:
            assert abs(cuda_path - reference) > 0.01 * reference  # the lesson's "more than 1%"


def test_old_cuda_spelling_is_autocast_for_cuda_and_warns() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = torch.cuda.amp.autocast(enabled=False)
    assert isinstance(old, torch.autocast) and old.device == "cuda"
    assert any(issubclass(w.category, FutureWarning) for w in caught)


def divides_the_queries_in_place(queries, keys, temperature):
    """Issue 61's held-out answer: `.float()` of fp32 queries is the caller's own tensor, and the
    in-place division changes it (with autograd on, torch refuses it on a leaf needing grad)."""
    with torch.autocast(device_type=queries.device.type, enabled=False):
        q = queries.float()
        q /= temperature
        return F.cross_entropy(q @ keys.float().T, targets(queries))


def test_an_in_place_change_to_the_caller_s_queries_is_named() -> None:
    result = check_contrastive_loss(divides_the_queries_in_place)
    assert checking.INPUT_CHANGED in result.keys, str(result)
    assert "no_grad" in str(result)  # the scenario where torch let it through
