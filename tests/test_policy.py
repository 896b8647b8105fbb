"""The policy probe names autocast's own decisions and never mistakes type promotion for one."""

import pytest
import torch

from amp_tutorial.policy import (
    BANNED,
    FP32,
    FP32_OUT,
    LOWERED,
    NO_RULE,
    PROMOTE,
    SOURCE_POLICY,
    Case,
    Outcome,
    _verdict,
    autocast_policy,
    header_policy,
    header_rules,
    ops_by_rule,
    policy_table,
    registered_ops,
    trace_dtypes,
    visible_promotions,
)

BF16, FP32_T = torch.bfloat16, torch.float32


@pytest.fixture(scope="module")
def cpu_rows():
    return {r.op: r for r in autocast_policy("cpu", BF16)}


def test_add_is_type_promotion_not_an_autocast_rule(cpu_rows):
    add = cpu_rows["add (a + b)"]
    mixed = add.cases["mixed"]
    # bf16 + fp32 gives fp32 with autocast off as well as on: the old probe called that "widest"
    assert mixed.off.dtype == mixed.on.dtype == FP32_T
    assert not mixed.added_casts
    assert add.verdict == NO_RULE
    assert cpu_rows["mul (a * b)"].verdict == NO_RULE


def test_cat_is_promoted_by_autocast_for_the_right_reason(cpu_rows):
    # cat and addcmul both give fp32 for mixed inputs with autocast off (type promotion) ...
    for op in ("cat", "addcmul"):
        assert cpu_rows[op].cases["mixed"].off.dtype == FP32_T
    # ... but only cat is on CPU's promote list: autocast casts its bf16 input up first.
    assert cpu_rows["cat"].cases["mixed"].added_casts == {(BF16, FP32_T): 1}
    assert cpu_rows["cat"].verdict == PROMOTE
    assert not cpu_rows["addcmul"].cases["mixed"].added_casts
    assert cpu_rows["addcmul"].verdict == NO_RULE  # promote on CUDA, on no CPU list


def test_index_copy_promote_is_visible_on_cpu(cpu_rows):
    mixed = cpu_rows["index_copy"].cases["mixed"]
    assert mixed.off.error and "same dtype" in mixed.off.error  # fails without autocast
    assert mixed.on.error is None and mixed.on.dtype == FP32_T  # works with it
    assert visible_promotions(list(cpu_rows.values())) == ["index_copy"]


def test_lowered_ops_cast_their_fp32_inputs_down(cpu_rows):
    for op in ("matmul (a @ b)", "linear", "conv2d", "bmm"):
        full = cpu_rows[op].cases["fp32"]
        assert (full.off.dtype, full.on.dtype) == (FP32_T, BF16), op
        assert full.added_casts == {(FP32_T, BF16): 2}, op  # both inputs cast by autocast
        assert cpu_rows[op].verdict == LOWERED


def test_cpu_fp32_list_versus_no_list(cpu_rows):
    for op in ("mse_loss", "binary_cross_entropy", "prod"):
        low = cpu_rows[op].cases["low"]
        assert (low.off.dtype, low.on.dtype) == (BF16, FP32_T), op
        assert cpu_rows[op].verdict == FP32
    # CUDA runs these in fp32; CPU autocast leaves them in bf16 (no list)
    for op in ("exp", "log", "pow", "layer_norm", "sum", "cumsum", "softmax"):
        low = cpu_rows[op].cases["low"]
        assert low.off.dtype == low.on.dtype == BF16 and not low.added_casts, op
        assert cpu_rows[op].verdict == NO_RULE
    # CPU's prod is plain fp32: it casts the input up even when dtype= is given
    assert cpu_rows["prod"].cases["low, dtype=low"].added_casts == {(BF16, FP32_T): 1}


def test_raising_calls_are_reported_not_raised(cpu_rows):
    dot = cpu_rows["dot"].cases["mixed"]  # dot is promote on CUDA only
    assert dot.off.error and dot.on.error and "same dtype" in dot.on.error
    row = next(r for r in policy_table(list(cpu_rows.values()), BF16) if r["op"] == "dot")
    assert row["bf16 + fp32 in (off -> on)"] == "raises -> raises"


def test_measured_cpu_policy_matches_the_source_lists(cpu_rows):
    assert {op: r.verdict for op, r in cpu_rows.items()} == SOURCE_POLICY["cpu"]
    groups = ops_by_rule(list(cpu_rows.values()))
    assert groups[FP32_OUT] == [] and groups[BANNED] == []  # CPU has neither list


@pytest.mark.parametrize("device_type", ["cpu", "cuda", "xpu"])
def test_source_lists_match_this_torch_builds_registrations(cpu_rows, device_type):
    """An op has an Autocast<device> kernel in the installed torch iff the source lists it."""
    registered = registered_ops(list(cpu_rows.values()), device_type)
    if registered is None:
        pytest.skip("this torch has no _dispatch_has_kernel_for_dispatch_key")
    listed = {op: rule != NO_RULE for op, rule in SOURCE_POLICY[device_type].items()}
    assert registered == listed


def _case(off, on, off_casts=(), on_casts=(), off_err=None, on_err=None):
    return Case(Outcome(off, off_err, tuple(off_casts)), Outcome(on, on_err, tuple(on_casts)))


def test_verdict_rules_for_cuda_only_policies():
    """The branches CPU cannot show (fp32_set_opt_dtype, banned), on cases shaped like CUDA's."""
    plain = _case(FP32_T, FP32_T)
    # sum on CUDA: bf16 in -> fp32 out, but an explicit dtype= is left alone
    sum_like = {"fp32": plain, "low": _case(BF16, FP32_T), "low, dtype=low": _case(BF16, BF16)}
    assert _verdict(sum_like, BF16) == FP32_OUT
    # prod on CPU: the explicit dtype= case still gets its input cast up
    prod_like = {**sum_like, "low, dtype=low": _case(BF16, BF16, on_casts=[(BF16, FP32_T)])}
    assert _verdict(prod_like, BF16) == FP32
    # binary_cross_entropy on CUDA: works off, raises on
    bce_like = {"fp32": _case(FP32_T, None, on_err="RuntimeError: unsafe to autocast"),
                "low": _case(BF16, None, on_err="RuntimeError: unsafe to autocast")}
    assert _verdict(bce_like, BF16) == BANNED
    # dot on CUDA: mixed inputs raise off, run in fp32 on
    dot_like = {"fp32": plain, "low": _case(BF16, BF16),
                "mixed": _case(None, FP32_T, off_err="RuntimeError: same dtype",
                               on_casts=[(BF16, FP32_T)])}
    assert _verdict(dot_like, BF16) == PROMOTE


def test_table_columns_name_the_dtype():
    rows = policy_table(autocast_policy("cpu", BF16), BF16)
    matmul = next(r for r in rows if r["op"] == "matmul (a @ b)")
    assert matmul["fp32 in (off -> on)"] == "fp32 -> bf16"
    assert matmul["casts autocast added"].startswith("fp32->bf16")
    relu = next(r for r in rows if r["op"] == "relu")
    assert relu["bf16 + fp32 in (off -> on)"] == ""  # unary op: no mixed-input case
    assert relu["autocast rule"] == NO_RULE


def test_trace_dtypes_sees_the_casts_autocast_inserts():


    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        traced = trace_dtypes(lambda: torch.nn.functional.layer_norm(layer(x), (4,)))
    ops = [(t.op, t.output) for t in traced]
    assert ("_to_copy", "bf16") in ops  # the weight and the input cast down
    assert ("addmm", "bf16") in ops  # the linear ran in bf16
    assert ops[-1] == ("native_layer_norm", "bf16")  # on CPU layer_norm keeps its input dtype
    plain = trace_dtypes(lambda: layer(x))  # no autocast: no casts, fp32 throughout
    assert all(t.output == "fp32" for t in plain) and "_to_copy" not in [t.op for t in plain]


def _header_or_skip() -> dict[str, str]:
    rules = header_rules()
    if rules is None:
        pytest.skip("this torch build ships no include/ATen/autocast_mode.h")
    return rules


@pytest.mark.parametrize("device_type", ["cuda", "xpu"])
def test_gpu_source_columns_match_the_installed_header(cpu_rows, device_type):
    """SOURCE_POLICY's CUDA/XPU rules are the AT_FORALL_* lists of this torch's autocast_mode.h
    (the ban on binary_cross_entropy lives in autocast_mode.cpp, so the header lists it nowhere)."""
    _header_or_skip()
    expected = {op: NO_RULE if rule == BANNED else rule
                for op, rule in SOURCE_POLICY[device_type].items()}
    assert header_policy(list(cpu_rows.values())) == expected


def test_header_parser_reads_overloads_and_every_list():
    rules = _header_or_skip()
    assert rules["softmax.int"] == rules["sum"] == FP32_OUT and rules["pow.Tensor_Scalar"] == FP32
    assert rules["linear"] == LOWERED and rules["scatter_add"] == PROMOTE
    assert {FP32, FP32_OUT, LOWERED, PROMOTE} == set(rules.values())
    # reductions that keep their input dtype under CUDA autocast (lesson 07 names them)
    assert not {"mean", "max", "amax", "min", "var", "std"} & set(rules)


def test_mps_lists_differ_where_lessons_04_and_07_say():
    """MPS autocast has a batch_norm kernel (fp32 list) and none for binary_cross_entropy."""
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if has_kernel is None:
        pytest.skip("this torch has no _dispatch_has_kernel_for_dispatch_key")
    listed = {dev: (has_kernel("aten::batch_norm", f"Autocast{dev}"),
                    has_kernel("aten::binary_cross_entropy", f"Autocast{dev}"))
              for dev in ("CPU", "CUDA", "XPU", "MPS")}
    assert listed == {"CPU": (False, True), "CUDA": (False, True), "XPU": (False, True),
                      "MPS": (True, False)}
