"""The policy probe names autocast's own decisions and never mistakes type promotion for one,
on this device and on fake tensors of the others."""

from functools import cache, partial

import pytest
import torch
import torch.nn.functional as F

from amp_tutorial import autocast_policy as policy
from amp_tutorial.autocast_policy import (
    BANNED,
    FAKE_TENSORS,
    FP32,
    FP32_OUT,
    HAS_RULE,
    LOWERED,
    NO_RULE,
    PROMOTE,
    REAL_DEVICE,
    REGISTRY,
    SOURCE_POLICY,
    Case,
    Outcome,
    _Op,
    _verdict,
    autocast_policy,
    header_policy,
    header_rules,
    ops_by_rule,
    policy_table,
    registered_ops,
    saved_bytes_on,
    source_policy,
    trace_dtypes,
    visible_promotions,
)
from amp_tutorial.data import make_problem
from amp_tutorial.measure import saved_bytes
from amp_tutorial.models import ConvModel

BF16, FP16, FP32_T = torch.bfloat16, torch.float16, torch.float32
LOW = [pytest.param(BF16, id="bf16"), pytest.param(FP16, id="fp16")]


@cache
def _probe(device_type: str, low: torch.dtype, how: str = "auto") -> dict[str, policy.OpPolicy]:
    return {r.op: r for r in autocast_policy(device_type, low, how=how)}


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


@pytest.mark.parametrize("device_type", ["cpu", "cuda", "xpu", "mps"])
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


def test_a_kernel_that_fails_in_low_precision_is_not_a_refusal():
    """torch 2.9's fake CUDA conv2d: bf16 raises with autocast off too, so the casts decide."""
    fails = "AcceleratorError: CUDA driver version is insufficient"
    conv_like = {"fp32": _case(FP32_T, None, on_casts=[(FP32_T, BF16)] * 2, on_err=fails),
                 "low": _case(None, None, off_err=fails, on_err=fails),
                 "mixed": _case(None, None, off_err=fails, on_err=fails)}
    assert _verdict(conv_like, BF16) == LOWERED
    # the same failure without autocast's casts is no rule, and never "refused"
    no_casts = {**conv_like, "fp32": _case(FP32_T, None, on_err=fails)}
    assert _verdict(no_casts, BF16) == NO_RULE


def test_source_lists_are_kept_per_torch_release():
    assert source_policy("2.14.1+cu130")[0] == "2.14.1"
    assert source_policy("2.9.1")[0] == "2.9.0" and source_policy("2.11.0")[0] == "2.11.0"
    assert source_policy("2.12.0") is None  # no source read for it: compare the registry only
    assert source_policy(torch.__version__) is not None  # every torch the tests run


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


@pytest.mark.parametrize("low", LOW)
def test_fake_cpu_probe_matches_the_real_cpu_probe(low):
    """FakeTensorMode goes through the same autocast kernels: the same rules and casts, and the
    same output dtype wherever the real call runs. Only meta kernels are laxer: some mixed-dtype
    calls that the real CPU kernel rejects (matmul, index_copy, ...) run on fake tensors."""
    real, fake = _probe("cpu", low), _probe("cpu", low, FAKE_TENSORS)
    assert {r.how for r in real.values()} == {REAL_DEVICE}
    assert {r.how for r in fake.values()} == {FAKE_TENSORS}
    assert {op: r.verdict for op, r in fake.items()} == {op: r.verdict for op, r in real.items()}
    laxer = set()
    for op, row in real.items():
        for case, measured in row.cases.items():
            faked = fake[op].cases[case]
            assert faked.added_casts == measured.added_casts, (op, case)
            for on in (False, True):
                ran, ran_fake = (measured.on, faked.on) if on else (measured.off, faked.off)
                assert ran_fake.casts == ran.casts, (op, case, on)
                if ran.error is None:
                    assert (ran_fake.error, ran_fake.dtype) == (None, ran.dtype), (op, case, on)
                elif ran_fake.error is None:
                    laxer.add((op, case))
    assert laxer and {case for _, case in laxer} == {"mixed"}


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("device_type", ["cuda", "xpu", "mps"])
def test_fake_gpu_probes_match_the_source_lists(device_type, low):
    """Every op of the list runs on fake CUDA, XPU and MPS tensors, with the rule the source
    registers for that device, for fp16 and bf16 alike."""
    rows = _probe(device_type, low, FAKE_TENSORS)
    assert {r.how for r in rows.values()} == {FAKE_TENSORS}
    assert {op: r.verdict for op, r in rows.items()} == SOURCE_POLICY[device_type]
    auto = autocast_policy(device_type, low)  # "auto": real where the device is here
    here = device_type in policy.available_devices()
    assert {r.how for r in auto} == {REAL_DEVICE if here else FAKE_TENSORS}


@pytest.mark.parametrize("low", LOW)
def test_fake_cuda_probe_matches_the_installed_header(low):
    """The fake-CUDA rules are autocast_mode.h's AT_FORALL_* lists, plus the ban on
    binary_cross_entropy that autocast_mode.cpp registers."""
    _header_or_skip()
    rows = _probe("cuda", low, FAKE_TENSORS)
    listed = header_policy(list(rows.values()))
    assert {op: r.verdict for op, r in rows.items()} == {
        **listed, "binary_cross_entropy": BANNED}
    assert "unsafe to autocast" in rows["binary_cross_entropy"].cases["fp32"].on.error


@pytest.mark.parametrize("low", LOW)
def test_mps_keeps_batch_norm_in_fp32_where_the_others_have_no_rule(low):
    bn = _probe("mps", low, FAKE_TENSORS)["batch_norm"].cases["low"]
    assert (bn.off.dtype, bn.on.dtype) == (low, FP32_T) and bn.added_casts == {(low, FP32_T): 1}
    for device_type in ("cpu", "cuda", "xpu"):
        other = _probe(device_type, low, FAKE_TENSORS)["batch_norm"].cases["low"]
        assert other.off.dtype == other.on.dtype == low and not other.added_casts, device_type
    # MPS's sums and softmax are plain fp32: an explicit dtype= still gets its input cast up
    given = _probe("mps", low, FAKE_TENSORS)["softmax"].cases["low, dtype=low"]
    assert given.on.dtype == low and given.added_casts[(low, FP32_T)] == 1


def test_an_op_that_cannot_run_on_fake_tensors_is_read_from_the_registry(monkeypatch):
    """BatchNorm in training with running statistics updates them with Tensor.copy_, which fails
    on fake MPS and XPU tensors (no device guard here); then the registry answers."""
    def bn_with_stats(a):
        stats = torch.zeros(a.shape[0], device=a.device), torch.ones(a.shape[0], device=a.device)
        return F.batch_norm(a.unsqueeze(0), *stats, training=True)

    monkeypatch.setattr(policy, "_ops", lambda n: {"batch_norm": _Op("aten::batch_norm", 1,
                                                                     bn_with_stats)})
    found = {dev: autocast_policy(dev, FP16, how=FAKE_TENSORS)[0] for dev in ("cuda", "mps", "xpu")}
    assert (found["cuda"].how, found["cuda"].verdict) == (FAKE_TENSORS, NO_RULE)  # it runs there
    if not torch.backends.mps.is_built():
        assert "not linked with support for mps" in found["mps"].cases["fp32"].off.error
        assert (found["mps"].how, found["mps"].verdict) == (REGISTRY, HAS_RULE)
        assert (found["xpu"].how, found["xpu"].verdict) == (REGISTRY, NO_RULE)


def test_a_fake_probe_leaves_autocast_as_it_found_it():
    before = {dev: (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
              for dev in ("cuda", "mps")}
    autocast_policy("cuda", BF16, how=FAKE_TENSORS)
    autocast_policy("mps", BF16, how=FAKE_TENSORS)
    assert before == {dev: (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
                      for dev in ("cuda", "mps")}
    with pytest.raises(ValueError, match="how must be"):
        autocast_policy("cpu", BF16, how="registry")


BUILD, BATCH = partial(ConvModel, 32, 1), partial(make_problem, 16)  # 2 BatchNorm layers


def _real_cpu_bytes(low):
    torch.manual_seed(0)
    model, (inputs, targets) = BUILD(), BATCH("cpu")

    def forward_and_loss():
        with torch.autocast("cpu", dtype=low or BF16, enabled=low is not None):
            F.mse_loss(model(inputs), targets)

    return saved_bytes(forward_and_loss, model).new


def test_saved_bytes_on_fake_cpu_match_the_real_count():
    """Exact in fp32. Under autocast, CPU batch_norm's meta kernel returns its saved mean and
    inverse std in the input's dtype where the real kernel keeps them in float32."""
    assert saved_bytes_on("cpu", BUILD, BATCH).new == _real_cpu_bytes(None)
    for low in (BF16, FP16):
        missing = _real_cpu_bytes(low) - saved_bytes_on("cpu", BUILD, BATCH, low).new
        bn_stats = sum(2 * m.num_features for m in BUILD().modules()
                       if isinstance(m, torch.nn.BatchNorm2d))
        assert missing == bn_stats * (4 - low.itemsize), low


@pytest.mark.parametrize("low", LOW)
def test_saved_bytes_on_fake_cuda_halve_under_autocast(low):
    """The course's ConvModel on a 64 x 64 grid: fake tensors hold no data, so size is free."""
    model, batch = ConvModel, partial(make_problem, 64)
    fp32 = saved_bytes_on("cuda", model, batch)
    assert fp32 == saved_bytes_on("cpu", model, batch)  # the same tensors in fp32
    assert fp32.cast_weights == 0 and fp32.held > 0  # fp32 keeps the weights themselves
    amp = saved_bytes_on("cuda", model, batch, low)
    assert abs(amp.activations / fp32.activations - 0.5) < 0.01
    weights = sum(p.numel() for p in model().parameters() if p.dim() > 1)  # conv weights
    assert 0 < amp.cast_weights <= weights * low.itemsize  # autocast's 16-bit copies


def test_saved_bytes_on_a_device_whose_fake_autograd_aborts_raise_instead():
    """Autograd on a fake MPS tensor is a C++ terminate without MPS support in the build: the
    helper finds that out in a child process and raises, so the caller survives."""
    if torch.backends.mps.is_built():
        pytest.skip("this torch has MPS support: autograd runs on fake MPS tensors")
    with pytest.raises(RuntimeError, match="not linked with support for mps devices"):
        saved_bytes_on("mps", BUILD, BATCH, FP16)


def test_trace_dtypes_tags_each_op_with_where_it_ran_and_times_it_when_asked():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    label = ["first"]

    def two_parts():
        h = layer(x)
        label[0] = "second"
        return h.exp()

    ops = trace_dtypes(two_parts, where=lambda: label[0], timed_on="cpu")
    assert [(op.op, op.where) for op in ops] == [("addmm", "first"), ("exp", "second")]
    assert all(op.seconds > 0 for op in ops)
    label[0] = "first"
    assert all(op.seconds == 0.0 and op.where == "" for op in trace_dtypes(two_parts))


def test_fake_xpu_tensors_leave_a_present_cuda_gpu_alone(monkeypatch):
    """torch 2.9 and 2.11 start the runtime of any fake cuda/xpu tensor whenever a GPU is present
    (this is their ``init_gpu_context``), so on an H100 the first fake XPU tensor raised "Torch not
    compiled with XPU enabled". Reproduced here with that rule and a CUDA GPU said to be present."""
    from torch._subclasses import fake_tensor

    started = []

    @cache
    def gpu_context_of_torch_2_11(device: torch.device) -> None:
        if torch.cuda.is_available() or torch.xpu.is_available():
            started.append(device.type)
            torch.empty(1, device=device)  # the real runtime: raises for xpu in a CUDA build

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fake_tensor, "init_gpu_context", gpu_context_of_torch_2_11)
    with policy.fake_tensors():
        assert torch.empty(2, device="xpu").device.type == "xpu"
    assert started == []  # the xpu runtime was never asked
    assert fake_tensor.init_gpu_context is gpu_context_of_torch_2_11  # put back on leaving
    with pytest.raises((AssertionError, RuntimeError)), fake_tensor.FakeTensorMode():
        torch.empty(2, device="xpu")  # without the course's guard: torch 2.11's failure
    assert started == ["xpu"]


ABORTING_ANSWER = '''
import torch
from amp_tutorial.autocast_policy import autocast_flags, fake_tensors

with fake_tensors(), autocast_flags("{device}", torch.float16):
    q = torch.empty(4, 8, device="{device}", dtype=torch.float16).float().requires_grad_()
    k = torch.empty(4, 8, device="{device}", dtype=torch.float16).float()
    k.requires_grad = True
    z = torch.zeros(4, device="{device}", requires_grad=True)
    out = (q @ k.T / 0.1 + z).sum()
    cpu = torch.ones(2).requires_grad_()
print(out.dtype, cpu.requires_grad)
'''


@pytest.mark.parametrize("device", sorted(policy._unbuilt_device_types()))
def test_autograd_on_a_fake_device_the_build_lacks_does_not_end_the_process(device):
    """A learner's ``requires_grad_()`` on a simulated MPS or XPU tensor made C++ terminate the
    process (a notebook's kernel died) where this build has no such device: inside
    ``fake_tensors`` those tensors are detached for every op; CPU tensors keep their autograd.
    Run in a child process, so that a regression fails this test instead of killing the run."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ABORTING_ANSWER.format(device=device)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.split() == ["torch.float32", "True"]
