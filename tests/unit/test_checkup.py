"""The AMP check-up: it finds a real fp16 hazard and names the module, passes a clean model, sees a
fix, leaves the model as it was, sends nothing anywhere, and answers bad input in one line."""

import ast
import copy
import dataclasses
import json
import math
import os
import socket
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_tutorial.checkup as checkup_module
from amp_tutorial.autocast_policy import OpTrace
from amp_tutorial.ceiling import Ceiling, MatmulRate
from amp_tutorial.checkup import (
    AGREEMENT,
    MODEL,
    Checkup,
    CheckupError,
    NotChecked,
    _advice,
    _recommend,
    amp_checkup,
    batch_to,
    checkup,
    main,
    output_loss,
    recommended_dtype,
    why_fp32_is_faster,
)
from amp_tutorial.device import (
    DeviceInfo,
    dtype_name,
    has_fp32_precision_api,
    select_device,
    tf32_state,
)
from amp_tutorial.interleave import PairedComparison, Ratio
from amp_tutorial.measure import Timing
from tests.unit.test_device import FAKE_H100, pretend_ampere, tf32_settings_kept

# a ceiling from fixed numbers, so no test spends its time on matmuls
CEILING = Ceiling(tuple(MatmulRate(64, d, Timing((t,))) for d, t in
                        (("fp32", 2e-3), ("bf16", 1e-3), ("fp16", 1e-3))))
OPTIONS = {"steps": 3, "warmup": 1, "ceiling": CEILING, "blocks": 5}  # blocks: the fewest


class RawCounts(nn.Module):
    """Raw counts (up to 100,000) straight into a Linear: outputs past 65504, then a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32))
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.stem(x))


class RawCountsFixed(RawCounts):
    """The check-up's advice followed: stem.0 in an fp32 region."""

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            h = self.stem[0](x.float())
        return self.head(self.stem[1](h))


def counts_batch():
    generator = torch.Generator().manual_seed(0)
    x = 1e5 * torch.rand(64, 8, generator=generator)
    return x, (x / 1e5 - 0.5).sum(1, keepdim=True).sin()


def make_clean():
    """module:function for the command line: a small MLP on normalised inputs."""
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    return (nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)),
            (x, x.sum(1, keepdim=True)), nn.functional.mse_loss)


def checked(model_class, dtype):
    torch.manual_seed(0)
    return amp_checkup(model_class(), counts_batch(), nn.functional.mse_loss, dtype=dtype,
                       **OPTIONS)


@pytest.fixture(scope="module")
def hazard():
    return checked(RawCounts, torch.float16)


def test_the_fp16_hazard_is_found_in_the_module_that_overflows(hazard):
    assert hazard.fp16_overflows == ["stem.0"] and hazard.flagged == ["stem.0"]
    row = next(r for r in hazard.ranges if r.module == "stem.0")
    assert row.act_max > 65504 and row.type == "Linear"
    assert hazard.first_nonfinite.startswith("stem.0 (Linear)")
    assert not hazard.agrees and math.isinf(hazard.output_rel_diff)
    lines = [a.line for a in hazard.advice]
    assert any("self.stem[0](h.float())" in line and "enabled=False" in line for line in lines)
    assert any("GradScaler" in line for line in lines) and hazard.grad_scaler
    preferred = dtype_name(select_device("cpu").amp_dtype)  # what was checked is not advertised
    assert hazard.recommended.startswith(f"{preferred}: ")  # as what the device prefers
    assert ("you asked for it" in hazard.dtype_why) == (preferred != "fp16")


def test_where_fp32_itself_moves_too_much_the_curves_are_not_judged():
    # issue 59: the loss limit grew with fp32's own spread without bound, so a model whose fp32
    # loss jumps from one rounding step of its weights was said to "agree". Here the loss is a
    # fast sine of the output: a nudge of one bf16 rounding step moves it arbitrarily, while the
    # outputs themselves agree to a rounding step
    def chaotic(out, target):
        return torch.sin(1e5 * (out - target)).pow(2).mean()

    torch.manual_seed(0)
    # two samples: the loss is the mean of two values that each jump anywhere in [0, 1]
    report = amp_checkup(nn.Linear(8, 1), (torch.randn(2, 8), torch.zeros(2, 1)), chaotic,
                         dtype=torch.bfloat16, **{**OPTIONS, "steps": 4})
    assert report.output_rel_diff < AGREEMENT[torch.bfloat16]  # the outputs agree
    assert report.loss_tolerance > checkup_module.MAX_LOSS_TOLERANCE and not report.discerning
    assert not report.agrees and report.verdict.startswith("cannot judge: fp32's own loss curve")
    assert "larger batch" in report.verdict
    # where fp32's spread leaves a limit that says something, the same report would be judged
    assert dataclasses.replace(report, fp32_spread=0.01).discerning


def test_following_the_advice_makes_fp16_agree_with_fp32(fixed):
    # 3 steps: the scaler skips the first two, so nothing but the initial weights was compared;
    # the check-up says so and how many steps to run, and with those it judges
    assert not fixed.judged and not fixed.agrees and fixed.verdict.startswith("cannot judge")
    [more] = [a.line for a in fixed.advice if "check again with more steps" in a.line]
    steps = int(more.split("steps=")[1].split(")")[0])
    assert steps == 6
    torch.manual_seed(0)
    fixed = amp_checkup(RawCountsFixed(), counts_batch(), nn.functional.mse_loss,
                        dtype=torch.float16, **{**OPTIONS, "steps": steps})
    assert fixed.judged and fixed.verdict == "agree"
    assert fixed.fp16_overflows == ["stem.0"]  # the fp32 output is still past 65504
    assert not fixed.ran_low("stem.0") and fixed.flagged == []
    assert fixed.agrees and fixed.first_nonfinite is None
    # the scaler backs off from 65536 (the head's weight gradient overflows fp16): a skipped step
    # changes no weight, so agreement compares losses after the same number of applied updates
    assert any(fixed.skipped_steps) and any("init_scale=" in a.line for a in fixed.advice)
    assert not any("enabled=False" in a.line for a in fixed.advice)


def test_bf16_holds_the_range_so_the_same_model_is_not_flagged():
    report = checked(RawCounts, torch.bfloat16)
    assert report.fp16_overflows == ["stem.0"]  # reported whatever the dtype ...
    assert report.flagged == [] and report.agrees and not report.grad_scaler  # ... not a hazard


def test_bf16_rounding_that_swamps_the_signal_is_flagged_at_its_first_module():
    torch.manual_seed(0)
    offset = nn.Linear(8, 16)
    offset.bias.data.fill_(1e4)  # outputs 1e4 +- about 1: bf16's step there is 64
    model = nn.Sequential(offset, nn.LayerNorm(16), nn.Linear(16, 1))
    x = torch.randn(64, 8)
    report = amp_checkup(model, (x, x.sum(1, keepdim=True)), nn.functional.mse_loss,
                         dtype=torch.bfloat16, **OPTIONS)
    assert report.fp16_overflows == [] and report.flagged == ["0"]  # not the LayerNorm after it
    assert next(r for r in report.ranges if r.module == "0").rounding > 10
    assert not report.agrees  # the LayerNorm takes the offset away; in bf16 nothing is left
    # fp32's own curve moves a lot when a 1e4 bias moves by one bf16 rounding step, so the
    # curves alone would pass; the outputs from the same weights still say DISAGREE
    assert report.loss_rel_gap < report.loss_tolerance
    assert report.output_rel_diff > AGREEMENT[torch.bfloat16] and report.verdict == "DISAGREE"
    assert any("self[0](h.float())" in a.line for a in report.advice)


def test_a_clean_model_gets_no_flag_and_its_ops_are_grouped_by_module():
    model, batch, loss_fn = make_clean()
    report = amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16, **OPTIONS)
    assert report.flagged == [] and report.fp16_overflows == [] and report.agrees
    # a well-conditioned model: fp32 hardly moves from nudged weights, AGREEMENT is the limit
    assert 0 < report.fp32_spread < AGREEMENT[torch.bfloat16] / 10
    assert report.loss_tolerance == AGREEMENT[torch.bfloat16]
    rows = {r["module"]: r for r in report.op_rows()}
    assert "addmm" in rows["0"]["ran in bf16"] and "addmm" in rows["2"]["ran in bf16"]
    assert "mse_loss" in rows["(loss)"]["ran in fp32"]  # CPU autocast's fp32 list
    assert 0 < report.fp32_time_share < 1
    saved = report.saved  # the activations halve; the 16-bit weight copies are counted apart
    assert saved["amp"].activations < saved["fp32"].activations
    assert saved["fp32"].cast_weights == 0 < saved["amp"].cast_weights
    # first the autocast line, after the fp32 line where bf16 is only emulated (this machine's)
    assert report.advice[bool(report.fp32_faster)].line.startswith("with torch.autocast")


def test_the_model_comes_back_as_it_was():
    model, batch, loss_fn = make_clean()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16, **OPTIONS)
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_nothing_leaves_the_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the check-up opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    model, batch, loss_fn = make_clean()
    amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16, **OPTIONS)
    imported = {node.module for node in ast.walk(ast.parse(Path(checkup_module.__file__)
                                                           .read_text()))
                if isinstance(node, ast.ImportFrom)}
    assert not imported & {"amp_tutorial.class_sync", "amp_tutorial.progress"}


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x):
        raise ValueError("shapes do not match")


class ReturnsDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x):
        return {"logits": self.linear(x)}


class ExpOverflows(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.exp = Exp()
        # fixed weights: built when the parameters are collected, before any seed, a random
        # linear(ones) was negative half the time, and exp(-8000) is 0, not inf
        nn.init.constant_(self.linear.weight, 0.1)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return self.exp(self.linear(x) * 1e4)


class Exp(nn.Module):
    def forward(self, x):
        return x.exp()


@pytest.mark.parametrize(("model", "inputs", "words"), [
    (Raises(), torch.randn(4, 8), "the model raised ValueError in an fp32 forward pass on this "
     "batch, before any AMP: shapes do not match"),
    (ReturnsDict(), torch.randn(4, 8), "the model returned a dict, not a tensor"),
    (nn.Linear(8, 1), torch.randn(4, 8, device="meta"),
     "the batch's inputs are on meta but the model is on cpu: move them with .to('cpu')"),
    (ExpOverflows(), torch.ones(4, 8), "the loss is inf in fp32, before any AMP (exp (Exp) "
     "produced"),
    (nn.Linear(8, 1), torch.full((4, 8), math.nan), "the loss is nan in fp32, before any AMP "
     "(the inputs hold inf or NaN)"),
], ids=["raises", "not-a-tensor", "other-device", "nonfinite-module", "nonfinite-inputs"])
def test_bad_input_gets_one_plain_line(model, inputs, words):
    torch.manual_seed(0)
    with pytest.raises(CheckupError) as caught:
        amp_checkup(model, (inputs, torch.zeros(4, 1)), nn.functional.mse_loss, **OPTIONS)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_too_big_for_the_device_is_refused_before_it_runs():
    model = nn.Linear(1024, 1024)  # 4 MiB of weights: the check-up holds five times that
    with pytest.raises(CheckupError, match=r"too big for cpu: .* needs about 0\.02 GiB"):
        amp_checkup(model, (torch.randn(2, 1024), torch.randn(2, 1024)),
                    nn.functional.mse_loss, free_bytes=2**20, **OPTIONS)


def test_command_line_prints_json_and_one_line_for_a_bad_target(capsys):
    assert main(["tests.unit.test_checkup:make_clean", "--json", "--steps", "3",
                 "--dtype", "bf16"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["amp_dtype"] == "bf16" and report["flagged"] == []
    assert report["advice"][bool(report["fp32_faster"])]["line"].startswith("with torch.autocast")
    assert main(["tests.unit.test_checkup"]) == 2
    assert capsys.readouterr().err.strip() == ("amp check-up: 'tests.unit.test_checkup' is not "
                                               "module:function (e.g. my_model:make)")


def test_free_memory_on_a_cpu_counts_the_page_cache_the_kernel_can_drop():
    free_pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # MemFree only
    assert checkup_module.free_bytes_on(torch.device("cpu")) >= free_pages * 0.9  # MemAvailable
    assert checkup_module.bytes_needed(nn.Linear(1024, 1024)) == 5 * (1024 * 1024 + 1024) * 4


def test_the_fp32_time_share_counts_the_casts_in_the_whole():
    """What the docstring says: fp32 op time over all op time, the casts autocast inserts in the
    total (issue 46: it said they were counted as neither)."""
    model, batch, loss_fn = make_clean()
    report = amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16, **OPTIONS)
    report = dataclasses.replace(report, ops=[
        OpTrace("addmm", ("bf16", "bf16", "bf16"), "bf16", "0", 1.0),
        OpTrace("mse_loss", ("fp32", "fp32"), "fp32", "(loss)", 1.0),
        OpTrace("_to_copy", ("fp32",), "bf16", "0", 2.0)])  # a cast: half the time
    assert report.fp32_time_share == pytest.approx(0.25)  # not 0.5: the casts are in the total
    doc = " ".join(type(report).fp32_time_share.__doc__.split())
    assert "the casts autocast inserts included in that total" in doc


def test_free_memory_on_a_gpu_counts_what_the_caching_allocator_holds_free(monkeypatch):
    """cudaMemGetInfo counts the allocator's cached blocks as used; the check-up's tensors can use
    them, so the too-big check adds reserved - allocated (issue 46)."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * gib)
    assert checkup_module.free_bytes_on(torch.device("cuda", 0)) == 22 * gib


@pytest.fixture
def tf32_settings():
    with tf32_settings_kept():
        yield


@pytest.fixture(scope="module")
def fixed():
    return checked(RawCountsFixed, torch.float16)


def tf32_advice(report, info, dtype):
    return [a for a in _advice(report, info, dtype) if "float32_matmul_precision" in a.line]


def test_tf32_advice_only_where_fp32_matmuls_remain(monkeypatch, tf32_settings, fixed):
    """Issue 43: the TF32 line is printed only where matmuls still run in fp32 under autocast
    (here the fixed model's stem.0, in its fp32 region); a model whose matmuls all run in the
    low dtype gets none."""
    h100 = pretend_ampere(monkeypatch)
    assert any(op.where == "stem.0" and op.op == "addmm" for op in fixed.fp32_matmuls)
    [advice] = tf32_advice(fixed, h100, torch.float16)
    assert advice.line.startswith('torch.set_float32_matmul_precision("high")')
    assert "addmm in stem.0" in advice.why
    model, batch, loss_fn = make_clean()
    clean = amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16, **OPTIONS)
    assert clean.fp32_matmuls == [] and tf32_advice(clean, h100, torch.bfloat16) == []
    monkeypatch.setattr(torch.version, "hip", "7.1.25424")  # ROCm: no TF32 to advise
    assert tf32_advice(fixed, h100, torch.float16) == []
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert tf32_advice(fixed, h100, torch.float16) == []  # a T4 has no TF32


@pytest.mark.skipif(not has_fp32_precision_api(), reason="this torch has only allow_tf32")
def test_following_the_tf32_advice_keeps_the_legacy_getters_answering(monkeypatch,
                                                                      tf32_settings, fixed):
    """The old line set only ``cuda.matmul.fp32_precision``, after which the legacy getters
    raise (and torch 2.9's Inductor reads one for an fp32 matmul, pytorch/pytorch#166387); the
    advice's own line sets both, on the torch this runs on."""
    h100 = pretend_ampere(monkeypatch)
    [advice] = tf32_advice(fixed, h100, torch.float16)
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # what the old advice did
    with pytest.raises(RuntimeError, match="legacy and new"):
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018
    torch.backends.cuda.matmul.fp32_precision = "none"
    exec(advice.line, {"torch": torch})  # follow the advice as written
    assert tf32_state()["matmuls"] is True
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.get_float32_matmul_precision() == "high"
    assert tf32_advice(fixed, h100, torch.float16) == []  # followed: not advised again


def test_a_forward_overflow_gets_no_scale_advice(hazard):
    # issue 43: the loss is NaN at every step, so the scaler halves each step; its last scale
    # is a count of steps, and no scale fixes an overflow in the forward
    lines = [a.line for a in hazard.advice]
    assert not any("init_scale=" in line for line in lines)
    assert any("no GradScaler setting fixes this" in line and "stem.0" in line
               for line in lines)


def test_the_largest_safe_scale_counts_the_weight_gradients():
    # the fixed model's head weight gradient overflows fp16 from 2^17 (issue 43), where the
    # module outputs' gradients alone allowed 5.6e6
    fixed = checked(RawCountsFixed, torch.float16)
    torch.manual_seed(0)
    model = RawCountsFixed()
    nn.functional.mse_loss(model(counts_batch()[0]), counts_batch()[1]).backward()
    largest = max(float(p.grad.abs().max()) for p in model.parameters())
    assert fixed.scale_max == pytest.approx(65504.0 / largest, rel=1e-5)
    assert fixed.scale_max < 2.0**17
    # lifting 99% of the output gradients needs more than that: the advice says no scale fits
    assert fixed.scale_needed > fixed.scale_max
    assert any("no single scale fits" in a.why for a in fixed.advice)


def test_agreement_is_not_claimed_when_every_amp_step_was_skipped():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    x = torch.randn(64, 8)
    huge = 1e30  # every fp16 gradient overflows at any scale the scaler reaches in 6 steps

    def loss_fn(out, target):
        return nn.functional.mse_loss(out, target) * huge

    report = amp_checkup(model, (x, x.sum(1, keepdim=True)), loss_fn, dtype=torch.float16,
                         **OPTIONS)
    assert all(report.skipped_steps)
    assert not report.agrees and not report.judged and report.updates_compared == 0
    assert "cannot judge: 3 of 3 AMP steps skipped" in report.text()
    assert "run more steps (steps=6)" in report.verdict


def test_no_speed_verdict_from_noisy_timings(hazard):
    # issue 43: on a shared machine the speed verdict came from wall time whose spread passed
    # the course's NOISY rule; the timing rule holds for the check-up too
    # a report without an interleaved comparison (speed=None) is judged by its medians' rule
    quiet = dataclasses.replace(hazard, timing_ms={"fp32": 10.0, "amp": 20.0},
                                timing_iqr_ms={"fp32": 1.0, "amp": 1.0},
                                timing_wait_share={"fp32": 0.01, "amp": None}, speed=None)
    assert quiet.speed_noise is None and quiet.payoff_rows()[1]["speedup (t_fp32 / t)"] == 0.5
    noisy = dataclasses.replace(quiet, timing_iqr_ms={"fp32": 1.0, "amp": 6.0})
    assert "amp's spread is 30%" in noisy.speed_noise
    # a quiet spread from steps that each waited for a CPU (a job beside the whole run)
    crowded = dataclasses.replace(quiet, timing_wait_share={"fp32": 0.6, "amp": 0.0})
    assert "fp32's threads waited for a CPU 60% of the time" in crowded.speed_noise
    # lesson 18's payoff table printed NaN and None in these cells: a reason instead
    assert crowded.payoff_rows()[1]["speedup (t_fp32 / t)"] == "none: noisy"
    assert noisy.payoff_rows()[1]["speedup (t_fp32 / t)"] == "none: noisy"
    for rows in (noisy.payoff_rows(), quiet.payoff_rows()):
        cells = [v for row in rows for v in row.values()]
        assert not [v for v in cells if v is None or (isinstance(v, float) and math.isnan(v))]
    assert quiet.payoff_rows()[0]["peak memory (MB)"] == "n/a: no allocator"  # a CPU
    info = select_device("cpu")
    lines = [a.line for a in _advice(noisy, info, torch.float16)]
    assert not any("keep this model in fp32" in line for line in lines)
    assert any("idle machine" in line for line in lines)
    assert any("keep this model in fp32" in a.line for a in _advice(quiet, info, torch.float16))


def paired(estimate, control, blocks=5):
    return PairedComparison("AMP fp16", "fp32", Ratio(*estimate, blocks), Ratio(*control, blocks),
                            "wall time", "", controlled="fp32")


def test_the_speed_verdict_comes_from_steps_that_took_turns(hazard):
    # issue 57: fp32 and AMP were timed one after the other, so a load that came or went between
    # them moved one and not the other; now they take turns, fp32 twice as the A/A control
    speed = hazard.speed
    assert speed is not None and speed.baseline_name == "fp32" and speed.name == "AMP fp16"
    assert speed.estimate.blocks == speed.control.blocks == OPTIONS["blocks"]
    assert hazard.speedup == speed.ratio
    stated = dataclasses.replace(hazard, speed=paired((0.5, 0.45, 0.55), (1.0, 0.97, 1.04)))
    assert stated.speed_noise is None and stated.speedup == 0.5
    row = stated.payoff_rows()[1]
    assert row["speedup (t_fp32 / t)"] == 0.5
    assert row["90% interval"] == "0.45-0.55, wall time; fp32 against itself 1.00"
    # the control off 1 (the load moved between steps): no ratio, and the advice says so
    drifted = dataclasses.replace(stated, speed=paired((0.5, 0.45, 0.55), (1.3, 1.2, 1.4)))
    assert "fp32 against itself gave 1.30x" in drifted.speed_noise
    assert drifted.payoff_rows()[1]["speedup (t_fp32 / t)"] == "none: noisy"
    info = select_device("cpu")
    assert any("idle machine" in a.line for a in _advice(drifted, info, torch.float16))
    # an interval over half its median says too little
    wide = dataclasses.replace(stated, speed=paired((0.5, 0.3, 0.7), (1.0, 0.97, 1.04)))
    assert "is 80% of its median" in wide.speed_noise
    with pytest.raises(CheckupError, match=r"blocks \(2\) must be at least 5"):
        amp_checkup(RawCounts(), (torch.ones(2, 8), torch.ones(2, 1)), nn.functional.mse_loss,
                    blocks=2)


# --- any model and batch in (issue 43): real modules, batches and outputs of every structure ---

@dataclasses.dataclass
class LMOutput:
    """What a Hugging Face causal LM returns (a ``ModelOutput``): the loss it computed from
    ``labels``, or None without them, and the logits."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class TinyDecoder(nn.Module):
    """A decoder as Hugging Face's are called: int64 ``input_ids`` through an embedding, a causal
    self-attention layer, keyword ``attention_mask`` and ``labels``, the loss computed inside."""

    def __init__(self, vocab: int = 16, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None):
        n = input_ids.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=input_ids.device).triu(1)
        padding = None if attention_mask is None else attention_mask == 0
        logits = self.head(self.layer(self.embed(input_ids), src_mask=causal,
                                      src_key_padding_mask=padding))
        return LMOutput(None if labels is None else lm_loss(logits, labels), logits)


def lm_loss(logits, labels):
    """Next-token cross-entropy, as Hugging Face's causal LMs compute it from ``labels``."""
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def token_batch(labels=True):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (8, 12), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {**batch, "labels": ids} if labels else batch


def fresh(model_class, *args):
    torch.manual_seed(0)
    return model_class(*args)


def first_loss(model, compute):
    """The loss at the model's initial weights, computed here without the check-up."""
    with torch.no_grad():
        return float(compute(copy.deepcopy(model).train()))


@pytest.fixture(scope="module")
def decoder_report():
    model, batch = fresh(TinyDecoder), token_batch()
    expected = first_loss(model, lambda m: m(**batch).loss)
    return checkup(model, batch, dtype=torch.bfloat16, **OPTIONS), batch, expected


def test_a_model_that_computes_its_loss_from_a_keyword_batch_is_checked_as_it_comes(
        decoder_report):
    report, batch, expected = decoder_report
    assert isinstance(report, Checkup), report
    assert report.losses["fp32"][0] == pytest.approx(expected, rel=1e-6)  # the output's .loss
    assert batch["input_ids"].dtype == torch.int64  # token ids are never cast
    rows = {r["module"]: r for r in report.op_rows()}
    assert "embedding" in rows["embed"]["ran in fp32"]  # the int64 ids reached the embedding
    assert all("addmm" in rows[m]["ran in bf16"] for m in ("head", "layer.linear1"))
    assert "nll_loss_forward" in rows[MODEL]["ran in fp32"]  # the loss inside the model's forward
    assert report.agrees and math.isfinite(report.output_rel_diff)


def test_a_loss_fn_on_the_output_and_the_whole_dict_batch_gives_the_same_loss(decoder_report):
    """Without labels the model's output carries no loss; ``loss_fn(output, batch)`` gets the
    whole dict, so the same loss comes out as the one the model computes itself."""
    _, _, expected = decoder_report
    report = checkup(fresh(TinyDecoder), token_batch(labels=False),
                     lambda out, batch: lm_loss(out.logits, batch["input_ids"]),
                     dtype=torch.bfloat16, **OPTIONS)
    assert isinstance(report, Checkup), report
    assert report.losses["fp32"][0] == pytest.approx(expected, rel=1e-6)
    assert any(r["module"] == "(loss)" and "nll_loss_forward" in r["ran in fp32"]
               for r in report.op_rows())  # now outside the model: the loss_fn's row


Heads = namedtuple("Heads", ["logits", "aux_logits"])


class TwoHeads(nn.Module):
    """GoogLeNet's train-mode shape: a named tuple of the main and an auxiliary output."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.main = nn.Linear(32, 4)
        self.aux = nn.Linear(8, 4)

    def forward(self, x):
        return Heads(self.main(self.body(x)), self.aux(x))


def two_heads_loss(out, labels):
    return (nn.functional.cross_entropy(out.logits, labels)
            + 0.3 * nn.functional.cross_entropy(out.aux_logits, labels))


def test_a_named_tuple_output_goes_to_the_loss_fn_as_it_is():
    model = fresh(TwoHeads)
    generator = torch.Generator().manual_seed(0)
    x, labels = torch.randn(32, 8, generator=generator), torch.randint(0, 4, (32,),
                                                                       generator=generator)
    expected = first_loss(model, lambda m: two_heads_loss(m(x), labels))
    report = checkup(model, (x, labels), two_heads_loss, dtype=torch.bfloat16, **OPTIONS)
    assert isinstance(report, Checkup), report
    assert report.losses["fp32"][0] == pytest.approx(expected, rel=1e-6)
    assert report.ran_low("main") and report.ran_low("aux")  # both heads trained under AMP
    assert any(r.module == MODEL for r in report.ranges)  # the tuple's first tensor is ranged


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        out, _weights = self.attn(x, x, x)
        return self.head(out.mean(1))


def test_a_step_function_of_yours_runs_as_the_loss():
    """``step(model, batch) -> loss``: the check-up calls it for every forward and loss, and
    ranges and dtypes come out per module, the attention's tuple output included."""
    model = fresh(Attention)
    generator = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(8, 6, 16, generator=generator),
             "y": torch.randn(8, 1, generator=generator)}
    calls = []

    def step(model, batch):
        calls.append(torch.is_autocast_enabled("cpu"))
        return nn.functional.mse_loss(model(batch["x"]), batch["y"])

    expected = first_loss(model, lambda m: nn.functional.mse_loss(m(batch["x"]), batch["y"]))
    report = checkup(model, batch, step=step, dtype=torch.bfloat16, **OPTIONS)
    assert isinstance(report, Checkup), report
    assert report.losses["fp32"][0] == pytest.approx(expected, rel=1e-6)
    assert True in calls and False in calls  # run in fp32 and under autocast
    assert any(r.module == "attn" and r.type == "MultiheadAttention" for r in report.ranges)
    assert report.ran_low("attn") and report.agrees


def test_a_step_that_takes_gradients_itself_is_checked():
    """A gradient penalty (WGAN-GP, R1) or a physics-informed loss calls torch.autograd.grad
    inside the step: autograd must be on around the step, as it is in training, also where the
    check-up only reads the loss. The same step runs in plain torch, fp32 and under autocast."""
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    real = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))

    def step(model, batch):
        x = batch.clone().requires_grad_(True)
        score = model(x)
        (grad,) = torch.autograd.grad(score.sum(), x, create_graph=True)
        return score.mean() + 10 * ((grad.norm(dim=1) - 1) ** 2).mean()

    expected = float(step(copy.deepcopy(critic), real))  # autograd on: it takes a gradient
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(step(critic, real))  # plain torch runs it under autocast too
    report = checkup(critic, real, step=step, dtype=torch.bfloat16, **OPTIONS)
    assert isinstance(report, Checkup), report
    assert report.losses["fp32"][0] == pytest.approx(expected, rel=1e-6)
    assert report.ran_low("0") and report.agrees


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        out, _state = self.lstm(x)
        return self.head(out[:, -1])


class RecurrentFixed(Recurrent):
    """The check-up's advice followed: the LSTM in an fp32 region."""

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            out, _state = self.lstm(x.float())
        return self.head(out[:, -1])


def sequence_batch():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(16, 5, 8, generator=generator), torch.randn(16, 1, generator=generator)


def autocast_error(module, x):
    """What ``module(x)`` raises under bf16 autocast here, training as the check-up does."""
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            module(x)
    except RuntimeError as err:
        return str(err).splitlines()[0].rstrip(".")
    return None


class PairStem(nn.Module):
    """A module that returns a tuple, as an LSTM ``(output, (h, c))`` or an attention
    ``(output, weights)`` does: raw counts in, outputs past 65504."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, 8) * 0.5)

    def forward(self, x):
        y = x @ self.weight.t()
        return y, y.detach().abs().amax()


class TupleStem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm, self.head = PairStem(), nn.LayerNorm(32), nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.stem(x)
        return self.head(self.norm(h))


def similarity_loss(out, target):
    """A loss that calls a matmul (a contrastive loss's similarity matrix)."""
    return ((out @ out.t()) - target @ target.t()).pow(2).mean()


def test_a_loss_computed_low_is_advised_into_an_fp32_region_that_holds():
    # issue 59: "loss = loss_fn(output.float(), targets)" was advised for a loss built on a
    # matmul, where autocast lowers the matmul again and the .float() changes nothing
    torch.manual_seed(0)
    x = torch.randn(16, 8)
    report = amp_checkup(nn.Linear(8, 4), (x, torch.randn(16, 4)), similarity_loss,
                         dtype=torch.bfloat16, **OPTIONS)
    [line] = [a.line for a in report.advice if "loss_fn(output.float()" in a.line]
    assert line == ('with torch.autocast("cpu", enabled=False): '
                    "loss = loss_fn(output.float(), targets)")
    out, target = torch.randn(16, 4), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert similarity_loss(out.float(), target).dtype == torch.bfloat16  # .float() undone
        with torch.autocast("cpu", enabled=False):  # the advised line, as written
            assert similarity_loss(out.float(), target).dtype == torch.float32


def test_the_fp32_line_for_a_module_that_returns_a_tuple_unpacks_it():
    # issue 59: the keep-in-fp32 line assigned an LSTM's (output, (h, c)) to h, which then broke
    # the next layer; the line unpacks a tuple output, so it pastes where the call was
    torch.manual_seed(0)
    report = amp_checkup(TupleStem(), counts_batch(), nn.functional.mse_loss,
                         dtype=torch.float16, **OPTIONS)
    assert report.flagged == ["stem"]
    assert [r.returns_tuple for r in report.ranges if r.module == "stem"] == [True]
    [line] = [a.line for a in report.advice if "keep stem in fp32" in a.line]
    assert 'enabled=False): h, *rest = self.stem(h.float())' in line
    # and a module that returns one tensor is assigned as before
    assert not any(r.returns_tuple for r in report.ranges if r.module != "stem")


def test_an_lstm_that_bf16_autocast_cannot_run_here_is_one_plain_line():
    """oneDNN's LSTM has no bf16 primitive on a CPU without AVX-512 (the Zen 3): "could not create
    a primitive descriptor". Where it raises, the answer is a line naming the LSTM, and following
    it (the LSTM in fp32) checks; where bf16 LSTMs run, the check-up runs on it."""
    x, y = sequence_batch()
    error = autocast_error(fresh(Recurrent).lstm, x)
    report = checkup(fresh(Recurrent), (x, y), nn.functional.mse_loss, dtype=torch.bfloat16,
                     **OPTIONS)  # no exception escapes
    if error is None:
        assert isinstance(report, Checkup) and report.ran_low("lstm")
        return
    assert isinstance(report, NotChecked) and report.error == "RuntimeError"
    assert report.line.startswith("bf16 autocast cannot run this model on cpu: lstm (LSTM) "
                                  f"raised RuntimeError under autocast: {error}: keep lstm in "
                                  'fp32: with torch.autocast("cpu", enabled=False)')
    assert "\n" not in report.line and report.text().startswith("not checked: ")
    with pytest.raises(CheckupError, match="cannot run this model"):
        amp_checkup(fresh(Recurrent), (x, y), nn.functional.mse_loss, dtype=torch.bfloat16,
                    **OPTIONS)
    fixed = checkup(fresh(RecurrentFixed), (x, y), nn.functional.mse_loss,
                    dtype=torch.bfloat16, **OPTIONS)
    assert isinstance(fixed, Checkup) and not fixed.ran_low("lstm") and fixed.ran_low("head")


class ScatterSum(nn.Module):
    def forward(self, messages, index):
        total = torch.zeros(4, messages.shape[1], device=messages.device)  # fp32, always
        return total.index_add_(0, index, messages)


class Graph(nn.Module):
    """Message passing into a buffer made in fp32: under autocast the messages are bf16, and
    ``index_add_`` refuses to mix them, on every device."""

    def __init__(self) -> None:
        super().__init__()
        self.message = nn.Linear(8, 8)
        self.aggregate = ScatterSum()
        self.head = nn.Linear(8, 1)

    def forward(self, x, index):
        return self.head(self.aggregate(self.message(x), index))


def test_a_forward_that_raises_under_autocast_names_the_module_that_raised():
    generator = torch.Generator().manual_seed(0)
    batch = (torch.randn(16, 8, generator=generator), torch.randint(0, 4, (16,),
                                                                    generator=generator),
             torch.randn(4, 1, generator=generator))  # (inputs..., targets): model(x, index)
    report = checkup(fresh(Graph), batch, nn.functional.mse_loss, dtype=torch.bfloat16,
                     **OPTIONS)
    assert isinstance(report, NotChecked)
    assert report.line.startswith("bf16 autocast cannot run this model on cpu: aggregate "
                                  "(ScatterSum) raised RuntimeError under autocast: index_add_()")
    assert "keep aggregate in fp32" in report.line and "\n" not in report.line


class Pairwise(nn.Module):
    """Attention over the whole sequence: L x L scores, 2^46 of them for L = 2^23 (256 TiB,
    past any machine's address space, so the allocation fails at once on every machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(1, 1), nn.Linear(1, 1)

    def forward(self, x):
        return (self.q(x) @ self.k(x).transpose(-1, -2)).mean((-1, -2))


def test_a_batch_past_the_memory_there_is_is_one_plain_line():
    report = checkup(fresh(Pairwise), (torch.zeros(1, 2**23, 1), torch.zeros(1)),
                     nn.functional.mse_loss, **OPTIONS)
    assert isinstance(report, NotChecked) and report.error == "RuntimeError"
    assert report.line.startswith("out of memory on cpu in one fp32 forward pass, before any "
                                  "AMP (RuntimeError: ")
    assert "can't allocate memory" in report.line and "check a smaller batch" in report.line
    assert "\n" not in report.line


@pytest.mark.parametrize(("model", "batch", "error", "words"), [
    (Recurrent(), sequence_batch()[0], "CheckupError", (
        "the model returned a Tensor with no loss in it, and no loss_fn was given: pass "
        "loss_fn=(output, targets) -> loss", "step=(model, batch) -> loss")),
    (TinyDecoder(), token_batch(labels=False), "CheckupError", (
        "the model returned a LMOutput (fields: loss, logits) with no loss in it",
        "needs its labels in the batch (e.g. labels=input_ids)")),
    (Recurrent(), sequence_batch(), "TypeError", (  # (inputs, targets), the loss_fn forgotten
        "the model raised TypeError in an fp32 forward pass", "called as model(*batch) as no "
        "loss_fn was given: pass loss_fn=(output, targets) -> loss")),
], ids=["tensor", "no-labels", "pair"])
def test_an_output_with_no_loss_and_no_loss_fn_says_what_to_pass(model, batch, error, words):
    report = checkup(model, batch, **OPTIONS)
    assert isinstance(report, NotChecked) and report.error == error
    assert all(w in report.line for w in words), report.line
    assert "\n" not in report.line


def test_output_loss_finds_the_loss_where_models_put_it():
    loss, logits = torch.tensor(2.0), torch.randn(4, 3)
    assert output_loss(LMOutput(loss, logits)) is loss  # ModelOutput.loss
    assert output_loss({"loss": loss, "logits": logits}) is loss
    assert output_loss((loss, logits)) is loss  # Hugging Face's return_dict=False
    assert output_loss(loss) is loss
    assert output_loss(Heads(torch.randn(1, 1), logits)) is None  # a batch of one is no loss
    assert output_loss(LMOutput(None, logits)) is None and output_loss(logits) is None


def test_batch_to_moves_a_nested_batch_and_casts_only_floating_tensors():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.int64),
             "pair": Heads(torch.ones(2), torch.ones(2, dtype=torch.bool)), "name": "x"}
    moved = batch_to(batch, "cpu", torch.bfloat16)
    assert moved["input_ids"].dtype == torch.int64 and moved["pair"].aux_logits.dtype == torch.bool
    assert moved["pair"].logits.dtype == torch.bfloat16 and isinstance(moved["pair"], Heads)
    assert moved["name"] == "x" and batch["pair"].logits.dtype == torch.float32  # a new batch
    with pytest.raises(CheckupError, match=r"the batch's input_ids are on meta but the model is "
                       r"on cpu: move them with \.to\('cpu'\) \(batch_to\(batch, 'cpu'\)"):
        amp_checkup(TinyDecoder(), batch_to(token_batch(), "meta"), **OPTIONS)


def test_a_loss_fn_and_a_step_together_are_refused():
    with pytest.raises(CheckupError, match="not both"):
        amp_checkup(nn.Linear(8, 1), torch.randn(4, 8), nn.functional.mse_loss,
                    step=lambda model, batch: model(batch).sum(), **OPTIONS)


# --- every advice line, followed, makes the model agree with fp32 (issue 43, item 2) ---

def advised(report, words):
    [line] = [a.line for a in report.advice if words in a.line]
    return line


def test_following_the_init_scale_advice_skips_no_step(fixed):
    """The scaler backed off from 65536 to 16384 (the head's weight gradient overflows fp16
    above 18028): started there, the same 3 steps skip none, and AMP agrees."""
    line = advised(fixed, "init_scale=")
    assert line == 'scaler = torch.amp.GradScaler("cpu", init_scale=16384)'
    torch.manual_seed(0)
    followed = amp_checkup(RawCountsFixed(), counts_batch(), nn.functional.mse_loss,
                           dtype=torch.float16, init_scale=16384.0, **OPTIONS)
    assert not any(followed.skipped_steps) and followed.judged and followed.agrees
    assert not any("init_scale=" in a.line for a in followed.advice)


def test_following_the_scale_advice_for_underflowing_gradients_makes_fp16_agree():
    """A loss scaled down to 1e-7 of itself: every fp16 output gradient is below 2^-24, so an
    unscaled fp16 step (init_scale=1) changes no weight and the loss curves part; the advice's
    GradScaler starts at the scale its gradients need, and fp16 then agrees."""
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))

    def tiny_loss(out, target):
        return nn.functional.mse_loss(out, target) * 1e-7

    def run(init_scale):
        torch.manual_seed(0)
        return amp_checkup(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)),
                           (x, x.sum(1, keepdim=True)), tiny_loss, dtype=torch.float16,
                           init_scale=init_scale, **{**OPTIONS, "steps": 6},
                           make_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2))

    unscaled = run(1.0)
    assert unscaled.judged and not unscaled.agrees  # no update: AdamW never moved fp16's weights
    line = advised(unscaled, "GradScaler(")
    assert line.startswith('scaler = torch.amp.GradScaler("cpu", init_scale=16777216); ')
    assert unscaled.scale_needed == 2.0**24 <= unscaled.scale_max
    followed = run(float(line.split("init_scale=")[1].split(")")[0]))
    assert followed.judged and followed.agrees and not any(followed.skipped_steps)


class HandNorm(nn.Module):
    """A hand-written RMS norm: ``h * h`` passes 65504 in fp16 once |h| passes 256, the mean
    and root follow it to inf, and ``h / inf`` is 0: the output is finite, and wrong."""

    def forward(self, h):
        return h / (h * h).mean(-1, keepdim=True).sqrt()


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.norm, self.head = nn.Linear(8, 32), HandNorm(), nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


class NormedFixed(Normed):
    """The advice followed: norm in fp32."""

    def forward(self, x):
        h = self.proj(x)
        with torch.autocast(x.device.type, enabled=False):
            h = self.norm(h.float())
        return self.head(h)


class Scores(nn.Module):
    """Attention whose scores ``q @ k.T`` overflow fp16 before the softmax (then NaN): large
    query and key weights (no 1/sqrt(d) scaling), the values as they come."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        with torch.no_grad():
            self.q.weight.mul_(100.0)
            self.k.weight.mul_(100.0)

    def forward(self, x):
        return torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), -1) @ self.v(x)


class Attends(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.head = Scores(), nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.attn(x).mean(1))


class AttendsFixed(Attends):
    """The advice followed: attn in fp32."""

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            h = self.attn(x.float())
        return self.head(h.mean(1))


def scaled_batch(shape, scale):
    generator = torch.Generator().manual_seed(0)
    return (scale * torch.randn(*shape, generator=generator),
            torch.randn(shape[0], 1, generator=generator))


@pytest.mark.parametrize(("model", "fixed_model", "batch", "module", "op"), [
    (Normed, NormedFixed, scaled_batch((64, 8), 100.0), "norm", "mul"),
    (Attends, AttendsFixed, scaled_batch((8, 6, 16), 3.0), "attn", "bmm"),
], ids=["finite-output", "attention-scores"])
def test_an_overflow_inside_a_module_is_found_and_keeping_it_in_fp32_agrees(
        model, fixed_model, batch, module, op):
    """Issue 43: only module outputs were checked, so an op that overflows inside a module
    (its fp32 output in range) got no advice; the op is found under fp16 autocast, the module
    is named, and the line that keeps it in fp32, followed, makes fp16 agree."""
    options = {**OPTIONS, "steps": 6}
    torch.manual_seed(0)
    report = amp_checkup(model(), batch, nn.functional.mse_loss, dtype=torch.float16, **options)
    assert report.fp16_overflows == [] and report.range_flagged == []  # outputs all in range
    first = report.op_overflows[0]
    assert (first.module, first.op, first.dtype) == (module, op, "fp16") and first.n_inf > 0
    assert report.flagged == [module] and not report.agrees
    line = advised(report, "enabled=False")
    assert f"h = self.{module}(h.float())  # keep {module} in fp32" in line
    assert any(f"forward overflows in {module}" in a.line for a in report.advice)
    assert not any("init_scale=" in a.line for a in report.advice)
    if module == "norm":  # the module's output is finite: the module-output check saw nothing
        assert report.first_nonfinite is None and "comes out finite" in " ".join(
            a.why for a in report.advice)
    torch.manual_seed(0)
    followed = amp_checkup(fixed_model(), batch, nn.functional.mse_loss, dtype=torch.float16,
                           **options)
    assert followed.op_overflows == [] and followed.flagged == []
    assert followed.judged and followed.agrees, followed.verdict


# a CPU as the check-up would see one with native bf16 (AVX512-BF16/AMX): nothing else differs
NATIVE_BF16_CPU = DeviceInfo(torch.device("cpu"), "cpu", "a fake CPU with native bf16",
                             (torch.float16, torch.bfloat16), True)


def test_bf16_is_recommended_where_it_is_native_and_following_it_agrees(hazard):
    """Issue 43: on a bf16-native GPU the check-up recommended fp16, "first of this device's
    AMP dtypes". Where bf16 is native it is recommended and checked by default, a forward
    overflow in fp16 gets the bf16 line, and bf16, followed, holds the range and agrees."""
    assert recommended_dtype(FAKE_H100) == torch.bfloat16  # fp16 first in its AMP dtypes
    assert "first of this device's AMP dtypes" not in _recommend(FAKE_H100, torch.float16)
    assert "recommended here: bf16" in _recommend(FAKE_H100, torch.float16)
    here = select_device("cpu")
    if not here.native_bf16:  # this Zen 3: bf16 is emulated, so it is not advised over fp16
        assert not any("dtype=torch.bfloat16" in a.line for a in _advice(hazard, here,
                                                                          torch.float16))
    [line] = [a.line for a in _advice(hazard, NATIVE_BF16_CPU, torch.float16)
              if "dtype=torch.bfloat16" in a.line]
    assert line.startswith('with torch.autocast(device_type="cpu", dtype=torch.bfloat16):')
    torch.manual_seed(0)
    followed = amp_checkup(RawCounts(), counts_batch(), nn.functional.mse_loss,
                           info=NATIVE_BF16_CPU, **OPTIONS)  # no dtype: the recommended one
    assert followed.amp_dtype == "bf16" and followed.recommended.startswith(
        "bf16: this device computes bf16 natively")
    assert followed.flagged == [] and followed.judged and followed.agrees


def test_following_the_keep_in_fp32_advice_for_bf16_rounding_agrees():
    """The module whose offset bf16 rounds away, kept in fp32 as the advice writes it."""

    class Offset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.offset, self.norm, self.head = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(
                16, 1)
            self.offset.bias.data.fill_(1e4)

        def forward(self, x):
            with torch.autocast(x.device.type, enabled=False):  # the advice's line
                h = self.offset(x.float())
            return self.head(self.norm(h))

    torch.manual_seed(0)
    x = torch.randn(64, 8)
    followed = amp_checkup(Offset(), (x, x.sum(1, keepdim=True)), nn.functional.mse_loss,
                           dtype=torch.bfloat16, **OPTIONS)
    assert followed.flagged == [] and followed.judged and followed.agrees


class LargeHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))


def test_an_output_past_fp16_is_kept_in_fp32_by_one_line_for_its_module():
    # issue 43 item 3: the head's output is the model's output; both were flagged, and the
    # advice said "keep head in fp32" and, for the model, "around the None in the model's own
    # forward" for the same finding
    model = fresh(LargeHead)
    model.head.bias.data.fill_(1e5)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    report = amp_checkup(model, (x, torch.full((32, 1), 1e5)), nn.functional.mse_loss,
                         dtype=torch.float16, **{**OPTIONS, "steps": 2})
    assert {r.module for r in report.ranges if r.overflows_fp16} == {MODEL, "head"}
    assert report.flagged == ["head"]
    lines = [a.line for a in report.advice if "enabled=False" in a.line]
    assert len(lines) == 1 and "self.head(h.float())" in lines[0]
    assert not any("None" in a.line for a in report.advice)


def test_no_matmul_ceiling_is_stated_where_the_dtype_is_emulated():
    """The bench's rule: an emulated dtype's matmul ratio bounds nothing (a model's other ops
    take other slow paths), so the payoff table states no ceiling and the summary says why."""
    emulated = Ceiling(CEILING.rates, emulated=("bf16",))
    model, batch, loss_fn = make_clean()
    report = amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16,
                         **{**OPTIONS, "ceiling": emulated})
    assert [r["matmul ceiling (t_fp32 / t)"] for r in report.payoff_rows()] == [
        "baseline", "none: emulated"]
    row = next(r for r in report.summary_rows() if r["finding"] == "matmul ceiling")
    assert row["value"] == "none" and "bf16 is emulated on this device" in row["why"]
    plain = amp_checkup(model, batch, loss_fn, dtype=torch.bfloat16, **OPTIONS)
    assert plain.payoff_rows()[1]["matmul ceiling (t_fp32 / t)"] == 2.0


def test_a_loss_trained_to_near_zero_is_judged_against_a_floor():
    """Issue 61: relative to a loss near 0, any rounding looked like a huge gap (1e-6 against 0
    read as 1e6). Below 1% of fp32's first loss, the gap is taken relative to that floor."""
    from amp_tutorial.checkup import LOSS_FLOOR, loss_gap

    assert loss_gap(0.51, 0.5, 1.0) == pytest.approx(0.02)  # the usual relative gap
    assert loss_gap(1e-6, 0.0, 1.0) == pytest.approx(1e-6 / LOSS_FLOOR)  # 1e-4, not 1e6
    assert loss_gap(2e-3, 1e-3, 1.0) == pytest.approx(1e-3 / LOSS_FLOOR)  # under the floor
    assert loss_gap(1.0, 0.0, 0.0) == pytest.approx(1e12)  # nothing to scale by: still a gap


EMULATED_BF16_CPU = DeviceInfo(torch.device("cpu"), "cpu", "a fake CPU that emulates bf16",
                               (torch.bfloat16,), False)


def test_where_every_low_dtype_is_emulated_the_advice_starts_with_fp32():
    """Issue 58: on a CPU that only emulates bf16 (the only AMP dtype a CPU is offered here),
    fp32 is the fast choice; the check-up says so first, and why, then the AMP lines it checked.
    Where bf16 is native, or on a GPU, it says nothing of the kind."""
    assert "fp32 is faster here" in why_fp32_is_faster(EMULATED_BF16_CPU)
    assert why_fp32_is_faster(NATIVE_BF16_CPU) is None and why_fp32_is_faster(FAKE_H100) is None
    report = checkup(fresh(RawCountsFixed), counts_batch(), nn.functional.mse_loss,
                     info=EMULATED_BF16_CPU, **OPTIONS)
    assert isinstance(report, Checkup), report
    first, autocast_line = report.advice[0], report.advice[1]
    assert first.line.startswith("# on this device: no autocast, fp32") and "emulates" in first.why
    assert "torch.autocast" in autocast_line.line and report.amp_dtype == "bf16"
    rows = {r["finding"]: r for r in report.summary_rows()}
    assert rows["fastest on this device"]["value"] == "fp32, no autocast"
    native = checkup(fresh(RawCountsFixed), counts_batch(), nn.functional.mse_loss,
                     info=NATIVE_BF16_CPU, dtype=torch.bfloat16, **OPTIONS)
    assert native.fp32_faster is None and "torch.autocast" in native.advice[0].line


def test_a_float64_model_is_refused_because_autocast_lowers_nothing_there():
    """Issue 59: a float64 model got "agree" and autocast advice, though autocast ran every op in
    float64 (ATen's is_eligible leaves kDouble tensors alone): one line saying so instead."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).double()
    inputs, targets = torch.randn(32, 8, dtype=torch.float64), torch.zeros(32, 1).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(inputs).dtype == torch.float64  # autocast left every op in float64
    report = checkup(model, (inputs, targets), nn.functional.mse_loss, **OPTIONS)
    assert isinstance(report, NotChecked), report
    assert "float64" in report.line and "model.float()" in report.line
