# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 65
#     memory:
#       cpu: 311
#       paper: 2458
#     minutes:
#       cpu: 0.2
#       small: 0.3
#       smoke: 0.2
#     needs: any device, CPU included; `binary_cross_entropy` is refused only on CUDA,
#       ROCm or XPU
#     track: advanced
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
# # 07 · Custom precision: fp32 regions, custom losses and autograd functions, validation
#
# Autocast picks a dtype per op from its lists (lesson 01). This lesson is about the code those
# lists do not know: your own numerically sensitive math, your own loss, your own
# `torch.autograd.Function`, and the evaluation loop. It builds on the training loop of lessons 03
# and 05 and uses the same model and problem.
#
# On a CPU, autocast runs in bfloat16; on NVIDIA and AMD GPUs, float16. Seeds are fixed
# (`torch.manual_seed`), so every run of this notebook starts from the same weights.

# %%
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from amp_tutorial.autocast_policy import (
    BANNED,
    FP32,
    NO_RULE,
    autocast_flags,
    autocast_policy,
    fake_tensors,
)
from amp_tutorial.data import make_problem
from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.exercises.contrastive_loss import check_contrastive_loss, make_cases
from amp_tutorial.models import seeded_conv_model
from amp_tutorial.presets import get_preset
from amp_tutorial.versions import parse

# %%
info = select_device()
preset = get_preset(device_type=info.type)
amp_dtype = info.amp_dtype
assert amp_dtype is not None, f"{info.device} has no usable AMP with this torch; try the CPU"
print(device_line(info, preset))

# %%
inputs, targets = make_problem(preset.grid, info.device)
loss_fn = nn.MSELoss()


def new_model(seed: int = 0) -> nn.Module:
    """The lesson-03 model, freshly initialised from ``seed``."""
    return seeded_conv_model(preset, info.device, seed)


# %% [markdown]
# The sections below need a trained model, not a good one, so first the AMP loop of lesson 03
# trains one for a few steps (at most 16; the scaler is on only where the dtype needs it, float16).

# %%
amp_model = new_model()
optimizer = torch.optim.Adam(amp_model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(info.type, enabled=info.needs_grad_scaler(amp_dtype))
amp_losses = []
for _ in tqdm(range(min(preset.steps, 16)), desc=f"AMP {dtype_name(amp_dtype)}"):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(info.type, dtype=amp_dtype):
        loss = loss_fn(amp_model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    amp_losses.append(loss.item())
print(f"AMP ({dtype_name(amp_dtype)}): loss {amp_losses[0]:.4f} -> {amp_losses[-1]:.4f}")
assert amp_losses[-1] < amp_losses[0]

# %% [markdown]
# ## 1. Numerically sensitive regions and custom losses
#
# Autocast decides per op. On CUDA (and XPU) matmuls and convolutions run in low precision;
# `sum`, `prod`, `cumsum`, `cumprod`, `softmax`, `log_softmax` and the `linalg` vector and matrix
# norms return fp32 (unless you pass a `dtype=`); `exp`, `log`, `pow`, `logsumexp`, most losses
# and `layer_norm`, `group_norm` run in fp32, and `rms_norm` too from torch 2.14 (before it,
# no rule: an fp16 input gives an fp16 output; probed below). Other reductions, `mean`, `max`,
# `amax`, `var` and `std` among them, are on no list and stay in the dtype they are given. The
# CPU list differs (lesson 01), and so does MPS's (it keeps `batch_norm` in fp32, lesson 04).
# Your own code can need more care. Two tools:
#
# - `torch.autocast(device_type, enabled=False)` **inside** an autocast region turns autocasting
#   off for a block. Tensors coming in keep their dtype (bf16/fp16), so cast them explicitly with
#   `.float()`; mixing dtypes in a matmul would fail;
# - a custom loss that casts its inputs to fp32 first, so the reduction and the final value are
#   computed and stored in fp32 and keep their precision.

# %%
# An fp16 input under CUDA float16 autocast, on fake CUDA tensors (PyTorch's dispatcher and CUDA's
# autocast rules, no GPU needed; lesson 01 explains fake tensors)
with fake_tensors(), autocast_flags("cuda", torch.float16):
    x = torch.ones(4, 8, device="cuda", dtype=torch.float16)
    out = {"sum": x.sum(), "cumsum": x.cumsum(-1), "softmax": x.softmax(-1),
           "log_softmax": x.log_softmax(-1), "vector_norm": torch.linalg.vector_norm(x),
           "exp": x.exp(), "logsumexp": x.logsumexp(-1), "layer_norm": F.layer_norm(x, (8,)),
           "mean": x.mean(), "amax": x.amax(-1), "var": x.var(),
           "sum(dtype=float16)": x.sum(dtype=torch.float16)}
for dtype in (torch.float32, torch.float16):
    ops = [op for op, result in out.items() if result.dtype == dtype]
    print(f"CUDA autocast gives {dtype_name(dtype)}: {', '.join(ops)}")
fp32_ops = ["sum", "cumsum", "softmax", "log_softmax", "vector_norm", "exp", "logsumexp",
            "layer_norm"]
assert all(out[op].dtype == torch.float32 for op in fp32_ops)
assert all(out[op].dtype == torch.float16 for op in ("mean", "amax", "var", "sum(dtype=float16)"))

# %%
# rms_norm under CUDA float16 autocast, on fake CUDA tensors (PyTorch's dispatcher, no GPU needed)
with fake_tensors(), autocast_flags("cuda", torch.float16):
    rms = F.rms_norm(torch.ones(4, 8, device="cuda", dtype=torch.float16), (8,))
print(f"torch {torch.__version__}: CUDA autocast's rms_norm of an fp16 input gives {rms.dtype}")
assert (rms.dtype == torch.float32) == (parse(torch.__version__)[:2] >= (2, 14))

# %%
model = amp_model  # the AMP-trained model from above
model.eval()
with torch.autocast(info.type, dtype=amp_dtype):
    features = model.layers[:-1](inputs)  # everything before the last 1x1 conv
    with torch.autocast(info.type, enabled=False):
        # A Gram matrix over all pixels (a style-loss ingredient): sums of products of many
        # values, which we want in fp32. Without the cast it would run in the features' dtype.
        flat = features.float().flatten(2)
        gram = flat @ flat.transpose(1, 2) / flat.shape[-1]
    prediction = model.layers[-1](features)
model.train()
print(f"features {features.dtype}, gram {gram.dtype}, prediction {prediction.dtype}")
# the features end in BatchNorm + ReLU: 16-bit, except on MPS (its autocast: batch_norm fp32)
assert features.dtype == (torch.float32 if info.type == "mps" else amp_dtype)
assert prediction.dtype == amp_dtype
assert gram.dtype == torch.float32 and gram.isfinite().all()


# %%
def mse_in_fp32(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A custom loss that is safe under autocast: cast first, then compute and reduce in fp32."""
    return (prediction.float() - target.float()).pow(2).mean()


def mse_in_input_dtype(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The unsafe version: the loss is computed and stored in the prediction's dtype."""
    return (prediction - target.to(prediction.dtype)).pow(2).mean()


reference = F.mse_loss(prediction.float(), targets)
safe, unsafe = mse_in_fp32(prediction, targets), mse_in_input_dtype(prediction, targets)
eps = torch.finfo(amp_dtype).eps
print(f"reference {reference.item():.8f}; fp32 loss {safe.item():.8f} ({safe.dtype}); "
      f"{dtype_name(amp_dtype)} loss {unsafe.item():.8f} ({unsafe.dtype}, eps {eps:.1e})")
assert safe.dtype == torch.float32 and torch.allclose(safe, reference, rtol=1e-6)
assert unsafe.dtype == amp_dtype  # about 2.4 (bf16) or 3.3 (fp16) significant digits

# %% [markdown]
# ### Why `binary_cross_entropy` is refused, and `binary_cross_entropy_with_logits` is the fix
#
# On CUDA (and ROCm) and on Intel XPU, autocast refuses `F.binary_cross_entropy` / `nn.BCELoss`
# outright with a `RuntimeError`: both register `binary_cross_entropy_banned` for the op in
# PyTorch's `aten/src/ATen/autocast_mode.cpp`. The CPU's autocast puts it on its fp32 list
# instead and runs it in fp32 (measured below when this runs on a CPU). MPS does neither: its
# autocast registers nothing for `binary_cross_entropy`, so there it runs unprotected in fp16 or
# bf16, on whatever dtype it is given (and fails on 16-bit probabilities with fp32 targets, which
# is why the cell passes the targets in the probabilities' dtype). Either way the trouble starts
# one op earlier: a sigmoid computed in low precision rounds probabilities close
# to 1 to exactly 1.0, and the BCE of a wrong prediction of 1.0 is `-log(0)`. PyTorch clamps
# that log at -100, so instead of a large loss and a useful gradient you get a flat 100.
# `binary_cross_entropy_with_logits` takes the logits, fuses sigmoid and log into one stable
# formula, and autocast runs it in fp32 on every device.

# %%
model = new_model()
with torch.autocast(info.type, dtype=amp_dtype):
    logits = model(inputs)
    try:
        probabilities = torch.sigmoid(logits)
        bce = F.binary_cross_entropy(probabilities, targets.to(probabilities.dtype))
        refusal = None
    except RuntimeError as err:
        refusal = err
    bce_logits = F.binary_cross_entropy_with_logits(logits, targets)

# %%
if refusal is not None:
    print(f"{info.type} autocast refused it:\n  RuntimeError: {refusal}")
    assert "unsafe to autocast" in str(refusal)
    assert "binary_cross_entropy_with_logits" in str(refusal)
else:
    print(f"{info.type} autocast ran binary_cross_entropy in {bce.dtype} (no refusal here)")
    if info.type == "cpu":
        assert bce.dtype == torch.float32  # the CPU policy runs it in fp32
    if info.type == "mps":
        assert bce.dtype == amp_dtype  # on no MPS list: runs in 16-bit, unprotected
print(f"binary_cross_entropy_with_logits under autocast: {bce_logits.item():.4f} "
      f"({bce_logits.dtype})")
assert bce_logits.dtype == torch.float32 and bce_logits.isfinite()
bce_logits.backward()  # and it trains

# %% [markdown]
# The same call on every device, whichever one this runs on: lesson 01's probe runs it on fake
# tensors of each device through PyTorch's own dispatcher, with that device's autocast on.

# %%
bce_rules = {dev: {r.op: r for r in autocast_policy(dev, torch.float16)}["binary_cross_entropy"]
             for dev in ("cpu", "cuda", "xpu", "mps")}
print({dev: f"{r.verdict} ({r.how})" for dev, r in bce_rules.items()})
assert {dev: r.verdict for dev, r in bce_rules.items()} == {
    "cpu": FP32, "cuda": BANNED, "xpu": BANNED, "mps": NO_RULE}
assert "unsafe to autocast" in bce_rules["cuda"].cases["fp32"].on.error  # the refusal's text

# The underlying problem: a confident wrong prediction, logit 12, true label 0.
logit, label = torch.tensor([12.0]), torch.tensor([0.0])
p_low = torch.sigmoid(logit.to(amp_dtype))
via_probability = F.binary_cross_entropy(p_low.float(), label)
via_logits = F.binary_cross_entropy_with_logits(logit, label)
print(f"sigmoid(12) in {dtype_name(amp_dtype)} = {p_low.item()}; BCE from that probability "
      f"{via_probability.item():.1f}; BCE from the logit {via_logits.item():.6f}")
assert p_low.item() == 1.0 and via_probability.item() == 100.0  # clamped -log(0)
assert torch.allclose(via_logits, torch.tensor(12.0), atol=1e-4)

# %% [markdown]
# ### Exercise: a contrastive loss that stays in fp32
#
# A contrastive (InfoNCE) loss scores every query embedding against every key,
# `logits = queries @ keys.T / temperature`, and query i's right answer is key i. Inside an
# autocast region that matmul runs in 16 bits (matmuls are on the lower-precision list of the
# CPU and of CUDA, lesson 01), and two inputs show what that costs: unnormalised embeddings whose
# dot products pass float16's largest value, 65504, and similarities that differ only a little
# on top of a large common part (256), which 16-bit rounding erases. After the matmul the CPU
# runs `cross_entropy` in fp32 (it is on the CPU's fp32 list); CUDA has no rule for it, and it
# calls `log_softmax` with the logits' own dtype, so on a GPU the log-probabilities are rounded to
# 16 bits as well. Either way the damage is done by the 16-bit logits.

# %%
for case in make_cases():  # the two inputs the checker below uses
    q, k = (x.to(info.device, amp_dtype) for x in (case.queries, case.keys))
    labels = torch.arange(len(q), device=info.device)  # query i's right answer is key i
    with torch.autocast(info.type, dtype=amp_dtype):
        logits = q @ k.T / case.temperature
        naive = F.cross_entropy(logits, labels)
    fp32 = F.cross_entropy(q.float() @ k.float().T / case.temperature, labels)  # no autocast
    print(f"{case.name}: logits {logits.dtype}, loss {naive.item():.6g} under autocast, "
          f"{fp32.item():.6g} in fp32")
    assert logits.dtype == amp_dtype
    dots = q.float() @ k.float().T
    if case.name == "large dot products":
        assert dots.abs().max() > torch.finfo(torch.float16).max
        assert amp_dtype != torch.float16 or not naive.isfinite()  # inf logits, NaN loss
    else:
        assert (dots - 256).abs().max() < 2  # 256 plus a little
        assert not torch.isclose(naive.float(), fp32, rtol=0.01)  # off by more than 1%

# %% [markdown]
# Write `contrastive_loss(queries, keys, temperature)`. It is called **inside** an autocast
# region (or none), with `queries` and `keys` of shape `(N, D)` in float16, bfloat16 or float32, on
# any device. It returns the mean over i of the cross-entropy of row i of the logits with target
# i, as a 0-dim float32 tensor computed in fp32, and gradients flow back to both inputs.
#
# The checker calls your function inside CPU autocast (float16, then bfloat16) on those two
# inputs, then on drawn ones (other N, D, temperatures and dtypes, autocast on or off, once under
# `torch.no_grad()`), comparing the loss and gradients with a right answer's. It does not read
# your source: it watches autocast's state at each torch call, the dtype each kernel ran in and
# the autocast regions you enter, so it can name the mistake it saw. Last runs on fake CUDA, XPU
# and MPS tensors (shapes and dtypes, no values) check that your code keeps fp32 on a GPU too
# (where a fake device cannot run an op, that run is left unjudged).

# %% tags=["exercise"] solution="contrastive_loss.py"
# YOUR CODE: replace the body of this function, run this cell, then run the checker below.
def contrastive_loss(queries, keys, temperature):
    """Mean InfoNCE loss (query i's positive is key i), computed in fp32 whatever autocast does."""
    raise NotImplementedError(
        "Turn autocast off for the inputs' device type inside the function, cast both inputs to "
        "float32 first thing in that region, then compute the logits and F.cross_entropy."
    )


# %%
result = check_contrastive_loss(contrastive_loss)
print(result)
assert result.passed, "fix the problems listed above, re-run your cell, then this one"

# %% [markdown]
# ## 2. Custom autograd functions: `torch.amp.custom_fwd` and `custom_bwd`
#
# Inside an autocast region, a custom `torch.autograd.Function` receives whatever dtypes the ops
# before it produced, and its `backward` runs later, outside the region. Two decorators make it
# behave:
#
# - `@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` on `forward`: inside an
#   autocast region, floating-point inputs are cast to fp32 and `forward` runs with autocast
#   **off** (without `cast_inputs`, `forward` runs under the caller's autocast state);
# - `@torch.amp.custom_bwd(device_type=...)` on `backward`: it runs with the same autocast state
#   as `forward` had.
#
# The example is a log-cosh loss, written in the stable form `|x| + log1p(exp(-2|x|)) - log 2`
# with the analytic gradient `tanh(x)`; it records the dtypes and autocast state it sees.

# %%
import math


def log_cosh(diff: torch.Tensor) -> torch.Tensor:
    """log(cosh(diff)) per element, in the stable form (no overflow of cosh for large |diff|)."""
    return diff.abs() + torch.log1p(torch.exp(-2 * diff.abs())) - math.log(2)


# %%
class LogCosh(torch.autograd.Function):
    """mean(log(cosh(prediction - target))), computed in fp32 whatever autocast is doing."""

    seen: dict = {}

    @staticmethod
    @torch.amp.custom_fwd(device_type=info.type, cast_inputs=torch.float32)
    def forward(ctx, prediction, target):
        LogCosh.seen["forward"] = (prediction.dtype, torch.is_autocast_enabled(info.type))
        diff = prediction - target
        ctx.save_for_backward(diff)
        return log_cosh(diff).mean()

    @staticmethod
    @torch.amp.custom_bwd(device_type=info.type)
    def backward(ctx, grad_output):
        (diff,) = ctx.saved_tensors
        LogCosh.seen["backward"] = (grad_output.dtype, torch.is_autocast_enabled(info.type))
        grad = grad_output * torch.tanh(diff) / diff.numel()
        return grad, -grad

# %%
model = new_model()
with torch.autocast(info.type, dtype=amp_dtype):
    prediction = model(inputs)
    loss = LogCosh.apply(prediction, targets)
loss.backward()
print(f"prediction {prediction.dtype}; forward saw {LogCosh.seen['forward']}, backward saw "
      f"{LogCosh.seen['backward']} (dtype, autocast enabled); loss {loss.dtype}")
assert prediction.dtype == amp_dtype
assert LogCosh.seen["forward"] == (torch.float32, False)
assert LogCosh.seen["backward"] == (torch.float32, False)
assert loss.dtype == torch.float32

# The analytic gradient agrees with autograd's for the same formula in fp32.
x = torch.randn(64, dtype=torch.float64, requires_grad=True)
zeros = torch.zeros(64, dtype=torch.float64)
assert torch.autograd.gradcheck(LogCosh.apply, (x, zeros))

# %% [markdown]
# What `cast_inputs` spares you depends on the device's lists. Here is the loss without it, on a
# 16-bit prediction and target under each device's autocast, probed on fake tensors (lesson 01):
# on a CPU every op stays in 16 bits; on CUDA, XPU and MPS `exp` and `log1p` are on the fp32 list
# (`AT_FORALL_FP32` in `autocast_mode.h` for CUDA and XPU; MPS registers its own) and promotion
# carries fp32 through the rest, but `prediction - target`, `abs` and `-2 * |diff|` still run in
# 16 bits: the difference is rounded before any fp32 op sees it.

# %%
from amp_tutorial.autocast_policy import autocast_flags, fake_tensors, trace_dtypes


def loss_ops(device_type: str) -> list[tuple[str, str]]:
    """The log-cosh loss's ops and output dtypes, on 16-bit inputs under that device's autocast."""
    with fake_tensors(), autocast_flags(device_type, amp_dtype):
        p, t = (torch.empty(4, 4, device=device_type, dtype=amp_dtype) for _ in range(2))
        ops = trace_dtypes(lambda: log_cosh(p - t).mean())
    return [(op.op, op.output) for op in ops if op.op != "_to_copy"]


for device_type in ("cpu", "cuda", "xpu", "mps"):
    ops = loss_ops(device_type)
    print(f"{device_type:>4}: " + ", ".join(f"{op} {dtype}" for op, dtype in ops))
    first = dict(reversed(ops))  # each op's first call: p - t, then |diff|
    assert first["sub"] == first["abs"] == dtype_name(amp_dtype)  # 16-bit on every device
    in_fp32 = {op for op, dtype in ops if dtype == "fp32"}
    assert in_fp32 == (set() if device_type == "cpu" else {"exp", "log1p", "add", "sub", "mean"})

# %% [markdown]
# ## 3. Validation under autocast
#
# Evaluation gets the same speed and memory benefit as training, and needs no scaler (there are
# no gradients). Three things belong in every evaluation loop: `model.eval()` (BatchNorm uses its
# running statistics and does not update them), `torch.inference_mode()` (no autograd graph), and
# the forward + loss under autocast. Put the model back in training mode afterwards.

# %%
@torch.inference_mode()
def evaluate(model: nn.Module, use_amp: bool) -> tuple[torch.Tensor, float]:
    was_training = model.training
    model.eval()
    with torch.autocast(info.type, dtype=amp_dtype, enabled=use_amp):
        output = model(inputs)
        loss = loss_fn(output, targets)
    model.train(was_training)
    return output, loss.item()


running_mean = amp_model.layers[1].running_mean.clone()
out_amp, val_amp = evaluate(amp_model, use_amp=True)
out_fp32, val_fp32 = evaluate(amp_model, use_amp=False)
print(f"validation loss of the AMP-trained model: {val_amp:.5f} under autocast "
      f"({out_amp.dtype}), {val_fp32:.5f} in fp32")
assert out_amp.dtype == amp_dtype and out_fp32.dtype == torch.float32
assert torch.is_inference(out_amp) and not out_amp.requires_grad
assert torch.equal(amp_model.layers[1].running_mean, running_mean)  # eval() froze BatchNorm
assert amp_model.training  # back in training mode
assert abs(val_amp - val_fp32) <= 0.05 * val_fp32

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in a cell above. Predict the outcome, then re-run from that cell.
# The outcomes were measured on a CPU, at `smoke` and `cpu`, in bf16 and in fp16 mode.
#
# 1. **A sigmoid less sure of itself.** In the fake-tensor probe's cell, change
#    `torch.tensor([12.0])` to `torch.tensor([7.0])` (the message still says `sigmoid(12)`). The
#    two 16-bit formats now part. bf16 still rounds sigmoid(7) = 0.99909 to 1.0 (its numbers just
#    below 1 are 2^-8 apart) and BCE is the flat 100; in fp16 mode it stays 0.99902, 2^-10 below 1
#    (fp16's are 2^-11 apart), and BCE is 6.9 (-log 2^-10), near the 7.0009 the logits give. The
#    asserts, written for 12, fail. Only the logits form is right for every logit, in both formats.
# 2. **No `cast_inputs`.** In `LogCosh`, delete `, cast_inputs=torch.float32` from `custom_fwd`.
#    `forward` now runs under the caller's autocast on the prediction as it comes: it sees
#    `(torch.bfloat16, True)` (`torch.float16` in fp16 mode), `backward` sees
#    `(torch.float32, True)` (`custom_bwd` gives it forward's autocast state), and the forward
#    assert fails. The loss is still float32 only because the fp32 target promotes
#    `prediction - target`; with a 16-bit target, every op of the loss stays in 16 bits on a CPU,
#    and on CUDA, XPU and MPS only `exp`, `log1p` and what follows them run in fp32 (the probe
#    after `LogCosh`).
# 3. **Backward inside the region.** In the cell after `LogCosh`, indent `loss.backward()` into the
#    `with` block. Nothing changes: backward still sees `(torch.float32, False)`, because
#    `custom_bwd` runs it with the autocast state `forward` had, which `cast_inputs` turned off.
#    Without `custom_bwd` it would see `True` and the backward assert would fail (checked by also
#    deleting the decorator): on a CPU, backward runs under the autocast state of its caller.

# %% [markdown]
# ## What to remember
#
# - Keep sensitive math in fp32 with `autocast(device_type=x.device.type, enabled=False)` and
#   explicit `.float()` casts (the region casts nothing itself); compute custom losses in fp32.
# - Use `binary_cross_entropy_with_logits`, never `sigmoid` + `binary_cross_entropy`.
# - Decorate custom Functions with `custom_fwd` (optionally `cast_inputs=torch.float32`) and
#   `custom_bwd`.
# - Validate with `model.eval()`, `torch.inference_mode()` and autocast, no scaler.
