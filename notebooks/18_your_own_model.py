# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 30
#     memory:
#       cpu: 571
#       paper: 7004
#     minutes:
#       cpu: 0.4
#       small: 0.3
#       smoke: 0.3
#     needs: 'any device, CPU included; TF32 advice: NVIDIA compute capability 8.0+'
#     track: core
#   jupytext:
#     notebook_metadata_filter: amp_tutorial,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 18 · Your own model: is it ready for AMP, and what do you write?
#
# You leave the course with a model of your own. This lesson answers the question you take home:
# *which dtype, does it need a GradScaler, where will it overflow, does AMP agree with fp32, and
# what does AMP gain here?* One call, `amp_checkup(model, (inputs, targets), loss_fn)`, runs your
# own training step a few times in fp32 and under autocast from the same weights (your model is
# left as it was) and reports each of those as a table. You run it on the course's two models,
# on a model with a real fp16 hazard, which it finds, and whose fix it checks, and on PyTorch's
# own transformer encoder, as it comes. Nothing of your model leaves your machine: the check-up
# sends nothing to the class's progress service.
#
# **Prerequisites:** lessons 01 (autocast's lists) and 02 (GradScaler, fp16's range); what the
# check-up does beyond them (a dtype trace, an fp32 region) is shown where it is used. Seeds are
# fixed, so every run starts from the same numbers.

# %%
import math
import sys

import pandas as pd
import torch
from torch import nn

from amp_tutorial.autocast_policy import has_autocast_kernel
from amp_tutorial.ceiling import SIZES, matmul_ceiling
from amp_tutorial.checkup import FP16_MAX, FP16_TINY, CheckupError, amp_checkup
from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.models import course_models
from amp_tutorial.plots import plot_broken_and_fixed, plot_losses
from amp_tutorial.presets import get_preset
from amp_tutorial.recorded import recorded_answers

info = select_device()
preset = get_preset(device_type=info.type)
print(device_line(info, preset))
torch.manual_seed(0)  # every run starts from the same numbers
pd.set_option("display.max_colwidth", None)  # the reasons in full
STEPS = max(3, min(preset.steps // 3, 8))  # training steps per precision: the loss curves
# this machine's matmul ceiling, measured once and shared by every check-up below
ceiling = matmul_ceiling(info, SIZES[preset.name][:1], budget_s=0.5)
print("\n".join(ceiling.lines()))

# %% [markdown]
# ## 1. The check-up on a model you know: which dtype, and why
#
# The ConvModel of lessons 03-06, with its image and MSE loss. The summary says which dtype the
# check-up recommends for this device and why (bf16 wherever the device computes it natively, as
# an NVIDIA GPU from Ampere on does: fp32's exponent range, no GradScaler; otherwise the device's
# first AMP dtype), whether that dtype needs a GradScaler, and the TF32 setting of the fp32
# baseline (NVIDIA only). Without `dtype=...` the check-up checks the dtype it recommends. And
# where bf16 is only emulated (a CPU without AVX512-BF16 or AMX), fp32 is the fast choice and AMP
# runs only to learn from: the summary and the advice then say so first, and the AMP lines are for
# the device you will train on.

# %%
from amp_tutorial.checkup import recommended_dtype

conv = course_models(preset, info.device)["ConvModel"]
conv_report = amp_checkup(conv.make(), (conv.inputs, conv.targets), conv.loss_fn,
                          steps=STEPS, ceiling=ceiling)
recommended = recommended_dtype(info)  # bf16 where native, else the device's first AMP dtype
assert conv_report.amp_dtype == dtype_name(recommended)  # checked: the recommended dtype
assert conv_report.recommended.startswith(f"{dtype_name(recommended)}: ")
assert conv_report.grad_scaler == info.needs_grad_scaler(recommended)  # fp16 needs one
# fp32 first where the only AMP dtype offered, bf16, is emulated (the device line says)
emulated_only = info.native_bf16 is False and info.amp_dtypes == (torch.bfloat16,)
assert (conv_report.fp32_faster is not None) == (info.type == "cpu" and emulated_only)
assert conv_report.flagged == [] and conv_report.fp16_overflows == []
assert conv_report.agrees, (conv_report.output_rel_diff, conv_report.loss_rel_gap)
pd.DataFrame(conv_report.summary_rows()).fillna("")

# %% [markdown]
# The ranges table holds, per module, the largest activation and gradient of the fp32 step
# against fp16's limits: 65504 is the largest fp16 value, 2^-14 its smallest normal (below it
# fp16 keeps fewer digits, and below 2^-24 a value becomes zero). The last numeric column is the
# AMP dtype's rounding step at a module's typical output over how much that output varies from
# sample to sample: above 0.5 (`checkup.ROUNDING_LIMIT`), rounding swamps what tells samples
# apart.

# %%
assert FP16_MAX == torch.finfo(torch.float16).max == 65504
assert FP16_TINY == torch.finfo(torch.float16).tiny == 2.0**-14
ranges = pd.DataFrame(conv_report.range_rows())
assert (ranges["max |activation|"] < FP16_MAX).all()  # nothing near fp16's overflow here
ranges

# %% [markdown]
# ## 2. Which ops ran in which dtype, module by module
#
# The check-up traces one AMP step below autocast (a `TorchDispatchMode` sees every ATen op after
# autocast has chosen its dtypes, and records them) and groups the ops by
# the module that ran them, the loss and the backward pass apart. On the course's transformer the
# linear layers run their matmul in the low dtype (`addmm` where `linear` is only a body that
# calls it: CPU, CUDA, XPU; `linear` itself on MPS, which has a kernel of its own for it, as
# `amp_tutorial.kernels` asks the dispatcher), while the layer norms get the fp32 residual
# stream (a low-precision output plus an fp32 input promotes to fp32) and run in fp32.

# %%
from amp_tutorial.kernels import has_device_kernel

# the op a Linear shows up as on this device: MPS dispatches aten::linear to its own kernel
linear_op = "linear" if has_device_kernel("aten::linear", info.type) else "addmm"
tf = course_models(preset, info.device)["transformer"]
tf_report = amp_checkup(tf.make(), (tf.inputs, tf.targets), tf.loss_fn, steps=STEPS,
                        ceiling=ceiling)
ops = pd.DataFrame(tf_report.op_rows()).set_index("module")
low = f"ran in {tf_report.amp_dtype}"
assert linear_op in ops.loc["blocks.0.attn.qkv", low] and linear_op in ops.loc["head", low]
norms = [m for m in ops.index if m.split(".")[-1].startswith("ln")]
assert norms and all(ops.loc[m, low] == "" for m in norms)  # every layer norm ran in fp32
assert 0 < tf_report.fp32_time_share < 1 and tf_report.agrees and tf_report.flagged == []
print(f"share of the traced step's op time in fp32 ops: {tf_report.fp32_time_share:.0%}")
ops

# %% [markdown]
# The share of time in fp32 ops is the part AMP cannot speed up: the larger it is, the further
# the whole step stays below the matmul ceiling. Agreement and payoff: the loss curves of fp32
# and AMP from the same weights (judged against fp32's own spread: fp32 rerun from weights moved
# by one rounding step of the AMP dtype, since a few Adam steps on a small batch can move fp32
# itself by more than 5%), then time per step and memory: fp32 and AMP steps of the model take
# turns, with fp32 twice as the control (`interleave`, as lesson 03 times them: the speed-up is
# the median over 8 blocks with its 90% interval, per core where the machine was busy), saved
# activations counted exactly and autocast's weight copies apart, peak memory from the
# allocator where the device has one, beside this machine's matmul ceiling. A cell with no
# figure says why in a word or two; where the speed-up is not stated, the course's recorded
# answer for the same model (lessons 03 and 12) is printed beside it.

# %%
fig = plot_losses(tf_report.losses, title="Transformer: fp32 and AMP from the same weights",
                  ylabel="cross-entropy")
print(f"outputs: {tf_report.output_rel_diff:.2e} relative difference; loss curves: "
      f"{tf_report.loss_rel_gap:.2e} at most (fp32 from nudged weights: "
      f"{tf_report.fp32_spread:.2e})")
assert tf_report.loss_rel_gap <= tf_report.loss_tolerance  # what "agree" asserted above
payoff = pd.concat({name: pd.DataFrame(r.payoff_rows()) for name, r in
                    (("ConvModel", conv_report), ("transformer", tf_report))})
saved = payoff["saved activations (MB)"]
assert (saved.xs(1, level=1) < saved.xs(0, level=1)).all()  # AMP saves fewer bytes, both
for name, report, lesson in (("ConvModel", conv_report, "03"), ("transformer", tf_report, "12")):
    for answer in recorded_answers(f"{lesson} train {report.amp_dtype}", info
                                   ) if report.speed_noise else []:
        print(f"{name}, no speed-up here ({report.speed_noise}); recorded: {answer}")
payoff

# %% [markdown]
# ## 3. A model with a real fp16 hazard
#
# A regressor fed raw counts (0 to 100,000 per feature, not normalised): its first `Linear`
# outputs values past 65504 and the `LayerNorm` after it brings them back to a few units. In
# fp32 and in bf16, whose exponent range is fp32's, that is fine. In fp16, the dtype NVIDIA and
# AMD GPUs use by default, the first layer gives `inf`. The check-up runs in fp16 here whatever
# your device prefers, because that is the hazard. CPU autocast has fp16 too, with the CPU's op
# lists: the `LayerNorm` runs in fp16 here and in fp32 under a GPU's autocast (checked below).
# The `Linear` before it is lowered on both, so it overflows on both.

# %%
class Counts(nn.Module):
    def __init__(self, n_features: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(n_features, hidden), nn.LayerNorm(hidden))
        self.body = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.stem(x))


torch.manual_seed(0)
counts = 1e5 * torch.rand(256, 8, device=info.device)  # raw counts, as they come
target = (counts / 1e5 - 0.5).sum(1, keepdim=True).sin()
torch.manual_seed(0)
hazard = amp_checkup(Counts().to(info.device), (counts, target), nn.functional.mse_loss,
                     dtype=torch.float16, steps=STEPS, ceiling=ceiling)
assert hazard.fp16_overflows == ["stem.0"] and hazard.flagged == ["stem.0"]
assert has_autocast_kernel("aten::layer_norm", "cuda") and not has_autocast_kernel(
    "aten::layer_norm", "cpu")  # fp32 on a GPU, the dtype it is given on a CPU
assert not hazard.agrees and not math.isfinite(hazard.loss_rel_gap)
assert hazard.first_nonfinite.startswith("stem.0 (Linear)")
stem_max = next(r.act_max for r in hazard.ranges if r.module == "stem.0")
assert torch.tensor(stem_max).to(torch.bfloat16).isfinite()  # bf16 holds it (max ~3.4e38)
print(f"first non-finite under fp16 autocast: {hazard.first_nonfinite}")  # the module's output
pd.DataFrame(hazard.range_rows())[["module", "max |activation|", "fp16 overflows"]]

# %% [markdown]
# What to do: each line comes with the finding it answers. Besides the autocast line, fp16 needs
# the GradScaler (most of `stem.0`'s output gradients are below 2^-24 and would be zero unscaled),
# and `stem.0` must stay in fp32. Its reason counts fewer `inf` than the line above: it names the
# first op that made one, autocast's cast of the raw counts to fp16 (each count from 65520 up
# becomes `inf`), while the line above counts `stem.0`'s whole output, where the matmul spreads
# them (`inf - inf` is NaN).

# %%
advice = pd.DataFrame(hazard.advice_rows())
cast_inf = int(counts.to(torch.float16).isinf().sum())  # counts past fp16's range, cast
assert any(f"_to_copy in stem.0 made {cast_inf} inf" in why for why in advice["why"])
stem = next(r for r in hazard.ranges if r.module == "stem.0")
assert stem.grad_below_smallest > 0.5  # most of stem.0's output gradients: zero unscaled
assert any("self.stem[0](h.float())" in line for line in advice["line"])
assert any("GradScaler" in line for line in advice["line"])
for line, why in zip(advice["line"], advice["why"], strict=True):
    print(f"{line}\n    # {why}\n")  # the line to write, then the finding it answers

# %% [markdown]
# ## 4. Following the advice
#
# You write the advice into the model's `forward`: `stem.0` runs in an autocast-disabled region
# on fp32 inputs, so its outputs past 65504 stay fp32, and the `LayerNorm` gets them in fp32.
# The rest of the model keeps running in fp16. The same check-up, from the same weights; the
# figure puts the broken run (left: no fp16 loss is finite, a red x marks each step) beside the
# fixed one (right: the fp16 curve lies on the fp32 one).

# %%
class CountsFixed(Counts):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):  # stem.0 in fp32
            h = self.stem[0](x.float())
        return self.body(self.stem[1](h))


torch.manual_seed(0)
fixed = amp_checkup(CountsFixed().to(info.device), (counts, target), nn.functional.mse_loss,
                    dtype=torch.float16, steps=STEPS, ceiling=ceiling)
assert fixed.fp16_overflows == ["stem.0"]  # its fp32 outputs still pass 65504 ...
assert not fixed.ran_low("stem.0") and fixed.flagged == []  # ... but it no longer runs in fp16
assert fixed.ran_low("body.0")  # the rest still does
assert fixed.first_nonfinite is None and fixed.agrees, (fixed.output_rel_diff, fixed.loss_rel_gap)
print(f"fixed: outputs differ by {fixed.output_rel_diff:.2e} (relative), loss curves by "
      f"{fixed.loss_rel_gap:.2e}")
assert not any(map(math.isfinite, hazard.losses["fp16"]))  # broken: no fp16 loss is finite
fig = plot_broken_and_fixed(hazard.losses, fixed.losses, ylabel="MSE loss",
                            title="Raw-counts model: fp32 and fp16 from the same weights",
                            broken_note="stem.0 in fp16 (past 65504)",
                            fixed_note="stem.0 in fp32, the rest fp16")

# %% [markdown]
# ## 5. A model you did not write
#
# PyTorch's own `nn.TransformerEncoder` (two `nn.TransformerEncoderLayer`s, each with an
# `nn.MultiheadAttention`), checked as it comes: its batch is a dict of keyword arguments, one of
# them a padding mask, and your loss is one line, `step(model, batch)`. Inside the attention, the
# mask becomes `-inf` scores: fp32 has them too, so the check-up does not blame autocast for them.
# What it shows is where the time goes: the projections run in the low dtype, but on a CPU the
# attention itself (`bmm`, softmax) runs in fp32, because training with dropout takes SDPA's math
# path, which computes in fp32 unless `allow_fp16_bf16_reduction_math_sdp(True)` (lesson 13).

# %%
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(info.device)
sequences = torch.randn(16, 32, 64, device=info.device)
padding = (torch.arange(32, device=info.device) >= 28).expand(16, 32)  # last 4: padding
wanted = torch.randn(16, 32, 64, device=info.device)
encoder_report = amp_checkup(
    encoder, {"src": sequences, "src_key_padding_mask": padding}, steps=STEPS, ceiling=ceiling,
    step=lambda model, batch: nn.functional.mse_loss(model(**batch), wanted))  # your loss
assert encoder_report.agrees and encoder_report.flagged == []
assert encoder_report.first_nonfinite is None  # the mask's -inf is not an overflow
attention = pd.DataFrame(encoder_report.op_rows()).set_index("module").loc["layers.0.self_attn"]
assert linear_op in attention[f"ran in {encoder_report.amp_dtype}"]  # the projections
if info.type == "cpu":  # SDPA's math path: the scores and softmax in fp32
    assert not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    assert "bmm" in attention["ran in fp32"] and "softmax" in attention["ran in fp32"]
attention

# %% [markdown]
# ## 6. What cannot be checked gets one plain line
#
# The check-up takes the model and batch you train: a batch of tensors, tuples or a dict (its
# keys become keyword arguments, as Hugging Face models take them), an output that is a tensor,
# a named tuple, a dict or a `ModelOutput`, and the loss from your `loss_fn(output, targets)`,
# from the output itself (`output.loss`, `output["loss"]`) or from your own
# `step(model, batch)`. What it still cannot work with comes back as one line saying what
# happened and what to try, never a traceback from deep inside: a model whose output holds no
# loss while no `loss_fn` was given, or a loss that is already NaN in fp32 (then the problem is
# not AMP's). `checkup(...)` returns that line as a `NotChecked` report; `amp_checkup(...)`
# raises it as a `CheckupError`.

# %%
from amp_tutorial.checkup import NotChecked, checkup


class ReturnsDict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"prediction": self.linear(x)}  # a dict with no "loss" in it


no_loss = checkup(ReturnsDict().to(info.device), counts, ceiling=ceiling)  # and no loss_fn
print(no_loss)
assert isinstance(no_loss, NotChecked) and "\n" not in no_loss.line
assert no_loss.line.startswith("the model returned a dict (keys: prediction) with no loss in it")
assert "pass loss_fn=(output, targets) -> loss" in no_loss.line  # what to try
try:
    amp_checkup(Counts().to(info.device), (counts * math.nan, target), nn.functional.mse_loss,
                ceiling=ceiling)
except CheckupError as err:
    print(err)
    assert "\n" not in str(err) and "in fp32, before any AMP" in str(err)
else:
    raise AssertionError("the check-up ran on a loss that is NaN in fp32")

# %% [markdown]
# For a script, `report.as_dict()` is the report as plain numbers and strings (`json.dumps` it),
# and the command line runs the check-up on a function of yours that returns
# `(model, (inputs, targets), loss_fn)`:
#
# ```bash
# python -m amp_tutorial.checkup my_project.models:make_for_checkup --json > checkup.json
# ```

# %%
as_json = fixed.as_dict()
assert {"amp_dtype", "ranges", "ops", "advice", "losses", "timing_ms"} <= set(as_json)
# nothing here loaded the class service's client: the check-up sends your model nowhere
assert not {"amp_tutorial.class_sync", "amp_tutorial.progress"} & set(sys.modules)
print(f"{len(as_json)} fields; amp_dtype {as_json['amp_dtype']!r}, "
      f"{len(as_json['advice'])} lines of advice")

# %% [markdown]
# ## Try it
#
# 1. **Your own model.** Replace `Counts()` and `(counts, target)` in section 3 with your model,
#    one real batch of your data and your loss function, and drop `dtype=torch.float16` to check
#    the dtype your device prefers. Read the summary first, then the advice: every line names the
#    finding it answers.
# 2. **Normalise instead.** In section 3, feed `counts / 1e5` instead of `counts`. You should see
#    `fp16_overflows == []` and an fp16 run that agrees with fp32, without an fp32 region.
# 3. **bf16.** In section 3, pass `dtype=torch.bfloat16` (where your device offers it). The ranges
#    table still says fp16 would overflow in `stem.0`, but nothing is flagged and the runs agree:
#    bf16 has fp32's exponent range.

# %% [markdown]
# ## What to remember
#
# - `amp_checkup(model, (inputs, targets), loss_fn)` recommends a dtype for your device (bf16
#   needs no GradScaler, fp16 does) and says why.
# - Compare each module's largest activation with 65504 before you train in fp16: a module past
#   it gives `inf`, and the check-up names it.
# - Keep such a module in fp32 (`torch.autocast(..., enabled=False)` around it, its inputs
#   `.float()`) and check again: fp16 then agrees with fp32.
# - The share of step time in fp32 ops is what AMP cannot speed up; the matmul ceiling is the
#   most it can.

# %% [markdown]
# ## Sources
#
# - [`torch.finfo`](https://docs.pytorch.org/docs/stable/type_info.html): fp16's largest value
#   (65504) and smallest normal (`tiny`, 2^-14).
# - [torch.amp, Autocast Op Reference](https://docs.pytorch.org/docs/stable/amp.html#autocast-op-reference)
#   and [`aten/src/ATen/autocast_mode.cpp`](https://github.com/pytorch/pytorch/blob/v2.14.1/aten/src/ATen/autocast_mode.cpp):
#   `addmm`/`linear` and `convolution` on the lower-precision lists; `layer_norm` on none of the
#   CPU's lists and on CUDA's fp32 list.
# - [torch.amp, autocast](https://docs.pytorch.org/docs/stable/amp.html#torch.autocast):
#   `enabled=False` inside an autocast region, with inputs cast to float32, runs that region in
#   fp32; `torch.amp.custom_fwd(cast_inputs=...)` does it for a function.
# - [`torch/amp/grad_scaler.py`](https://github.com/pytorch/pytorch/blob/v2.14.1/torch/amp/grad_scaler.py):
#   the GradScaler the check-up uses for fp16, and `GradScaler("cpu")`.
