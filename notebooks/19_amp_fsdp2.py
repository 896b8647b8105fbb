# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 25
#     memory:
#       cpu: 10
#       paper: 10
#     minutes:
#       cpu: 2.6
#       small: 2.1
#       smoke: 1.9
#     needs: any device, CPU included; it always runs 2 CPU processes (Gloo); the multi-GPU
#       and multi-node commands it shows need GPUs (NCCL/RCCL, XCCL)
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
# # 19 · AMP with FSDP2: mixed precision when the model is sharded
#
# DDP (lesson 11) keeps a whole copy of the model, its gradients and its optimizer state on every
# device. Once that no longer fits, FSDP2 (`torch.distributed.fsdp.fully_shard`) splits each
# parameter across the processes: each keeps a 1/N shard in fp32 and its optimizer updates only
# that shard. Before a sharded block runs, each process casts its shards to a 16-bit
# `param_dtype` and the copies are all-gathered; in backward its gradients are reduce-scattered
# in `reduce_dtype`. This lesson
# measures what that policy does that autocast does not (and the reverse), what the reduce dtype
# changes, fp16 with a GradScaler on sharded gradients, memory per process, and a sharded
# checkpoint resumed exactly.
#
# **Prerequisites:** lessons 01 (autocast's per-op lists), 02 (GradScaler), 11 (DDP, `torchrun`)
# and 12 (the transformer trained here). Every run below uses 2 CPU processes at the `smoke`
# preset, so it runs on every machine; the last section says how to run it on GPUs and nodes.

# %%
import json
import tempfile
from pathlib import Path

import pandas as pd
import torch
from IPython.display import display
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import _dispatch as dtensor_dispatch  # section 4 reads it

from amp_tutorial.autocast_policy import has_autocast_kernel, trace_module
from amp_tutorial.device import device_line, dtype_name, select_device
from amp_tutorial.distributed import process_group, torchrun
from amp_tutorial.fsdp import op_dtypes, shard, state_bytes
from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import make_transformer_problem, sequence_loss
from amp_tutorial.transformer import DecoderTransformer

info = select_device()
preset = get_preset("smoke")  # the runs start processes: the smallest sizes keep them quick
print(device_line(info, preset))
low = torch.bfloat16 if torch.bfloat16 in info.amp_dtypes else info.amp_dtype
work = Path(tempfile.mkdtemp(prefix="amp19_"))  # the runs' checkpoints and summaries
SCRIPT = Path("../scripts/train_fsdp.py").resolve()  # the course's programs sit beside notebooks/
assert SCRIPT.is_file(), f"{SCRIPT} not found: open this lesson from the course's notebooks/ folder"

# %% [markdown]
# ## 1. The policy casts parameters, autocast casts per op
#
# `MixedPrecisionPolicy(param_dtype=...)` acts on **parameters**: each process casts its shards
# of a block's weights to `param_dtype` before the all-gather, and what the block computes follows
# (with `cast_forward_inputs=True`, the default, every floating-point tensor passed to a sharded
# module's forward is cast too; integer token ids are left alone). Autocast acts
# on **ops**: it looks each one up in its lists (lesson 01) and casts that op's inputs. To see the
# difference, the cell traces every op of one forward pass, in this kernel, in a process group
# of one: the plain model under autocast, the sharded model with the policy, and both together.

# %%
config, batches, _ = make_transformer_problem(preset, info.device)
tokens, targets = batches[0]
policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)


def fresh_model() -> DecoderTransformer:
    torch.manual_seed(0)  # the same weights every time
    return DecoderTransformer(config).to(info.device)


with process_group(info.device):  # Gloo on a CPU; a group of one, no torchrun
    sharded = shard(fresh_model(), policy)
    with torch.autocast(info.type, dtype=low):
        traces = {"autocast": trace_module(fresh_model(), tokens)}
    traces["policy"] = trace_module(sharded, tokens)
    with torch.autocast(info.type, dtype=low):
        traces["policy + autocast"] = trace_module(sharded, tokens)
    sequence_loss(sharded(tokens), targets).backward()
    weight, grad = sharded.head.weight, sharded.head.weight.grad
table = pd.DataFrame(op_dtypes(traces)).set_index("op")
display(table)

# %% [markdown]
# Under autocast alone, the embeddings and the residual stream (`add`) stay fp32: `embedding`
# and `add` are on no list, and an fp32 input plus a 16-bit one gives fp32. With the policy,
# the weights themselves are 16-bit, so every op of the model runs in it, the embeddings, the
# residual stream and the LayerNorms too, as in pure bf16 (lesson 15). What stays fp32 is what the
# optimizer updates: the shards (`DTensor`s) and their gradients. With both, autocast still
# applies its per-op rules on top: an op on this device's fp32 list (on CUDA `layer_norm`,
# `softmax`, `pow`; on the CPU none of these, lesson 01) runs in fp32 again.

# %%
low_name = dtype_name(low)
assert table.loc["add", "autocast"] == "fp32" and table.loc["add", "policy"] == low_name
assert set(table["policy"]) <= {low_name, "-"}  # the policy: every op of the model in 16 bits
assert table.loc["addmm", "autocast"] == table.loc["addmm", "policy + autocast"] == low_name
norm = "fp32" if has_autocast_kernel("aten::layer_norm", info.type) else low_name
assert table.loc["native_layer_norm", "policy + autocast"] == norm
assert type(weight).__name__ == "DTensor" and weight.dtype == grad.dtype == torch.float32
print(f"sharded head.weight: {type(weight).__name__} {weight.dtype}, gradient {grad.dtype}; "
      f"LayerNorm under policy + autocast on {info.type}: {norm}")

# %% [markdown]
# Which to use: the policy alone is what large-model trainers such as torchtitan do (its
# `maybe_enable_amp` returns a null context once FSDP is on): all-gathers in 16 bits, half the
# bytes on the wire, every op in 16 bits. Add autocast where an op needs
# fp32 on your device, or keep such a module's policy at fp32 (`fully_shard` takes one policy
# per module). `output_dtype` casts a module's outputs: on the root, for example, logits in fp32
# for the loss. On every block it would fail (without CUDA autocast, whose fp32 rule for
# `layer_norm` would cast both): a block's fp32 output meets the root's final LayerNorm, whose
# weights are 16-bit, and only a sharded module's own inputs are cast.

# %%
with process_group(info.device):
    root_fp32 = MixedPrecisionPolicy(param_dtype=low, output_dtype=torch.float32)
    logits = shard(fresh_model(), policy, root_policy=root_fp32)(tokens)
print(f"logits with output_dtype=torch.float32: {logits.dtype}")
assert logits.dtype == torch.float32 and table.loc["addmm", "policy"] == low_name

# %% [markdown]
# ## 2. Two processes: `scripts/train_fsdp.py`
#
# [`scripts/train_fsdp.py`](../scripts/train_fsdp.py) trains lesson 12's transformer on the
# reversal task. Each process takes its half of every batch; `fully_shard` wraps each block and
# then the root (`amp_tutorial.fsdp.shard`); the loop has no autocast, because the policy already
# computes in 16 bits. Its loop, from the file:

# %%
source = SCRIPT.read_text()
cut = source.index  # the loop's training lines, without the summary's bookkeeping
print(source[cut("    for step in range(start, end):"):cut("        if step + 1 == args.inf_at")]
      + source[cut("        scaler.step(optimizer)"):cut("        skipped +=")])

# %% [markdown]
# The run below trains 24 steps with `param_dtype` bf16 and `reduce_dtype` fp32, writes a sharded
# checkpoint after step 12 and goes on; rank 0 also saves the first step's gradients.

# %%
run = {"a": work / "a.json", "ckpt": work / "ckpt", "grads32": work / "grads_fp32.pt"}
print(torchrun(SCRIPT, "--preset", "smoke", "--device", "cpu", "--param-dtype", "bf16",
               "--steps", "24", "--save-at", "12", "--checkpoint", str(run["ckpt"]),
               "--grads", str(run["grads32"]), "--summary", str(run["a"])))
first = json.loads(run["a"].read_text())
assert first["world_size"] == 2 and first["sharded_param_dtype"] == "fp32"
assert first["output_dtype"] == "bf16" and first["losses"][-1] < 0.5 * first["losses"][0]

# %% [markdown]
# ## 3. `reduce_dtype`: fp32 or 16 bits for the gradients' reduce-scatter
#
# Backward computes each process's gradients in bf16 (the weights are bf16). With
# `reduce_dtype=torch.float32` they are cast to fp32 before the processes sum them; with bf16
# each partial sum is rounded to bf16's 8 significant bits. Same weights, same first batch, only
# the reduce dtype changed:

# %%
run["grads16"] = work / "grads_bf16.pt"
torchrun(SCRIPT, "--preset", "smoke", "--device", "cpu", "--param-dtype", "bf16", "--steps", "1",
         "--reduce-dtype", "bf16", "--grads", str(run["grads16"]))
g32, g16 = torch.load(run["grads32"]), torch.load(run["grads16"])
diff = sum(((g32[k] - g16[k]) ** 2).sum() for k in g32) ** 0.5
size = sum((g ** 2).sum() for g in g32.values()) ** 0.5
print(f"gradients, bf16 reduce against fp32 reduce: {diff / size:.2e} relative "
      f"(one bf16 rounding: at most 2^-8 = {2 ** -8:.2e} of a value)")
assert 0 < diff / size < 2 ** -7

# %% [markdown]
# A relative error of about one bf16 rounding, on 2 processes. A ring-style reduction (Gloo,
# NCCL's ring) rounds again at every hop, so the error grows with the number of processes (about
# as its square root); an fp32 reduce costs twice the bytes on the wire and rounds the sum only to
# fp32. Use fp32 unless the reduce-scatter is what limits your step time.
#
# ## 4. fp16 with a GradScaler on sharded gradients
#
# With `param_dtype=torch.float16` the gradients can underflow (lesson 02), so the script adds
# a plain `torch.amp.GradScaler`. Each process checks only its own shards for inf/NaN, yet all
# must skip the same steps, or their shards would drift apart: DTensor's dispatcher handles the
# check (`aten._amp_foreach_non_finite_check_and_unscale_`) with `found_inf_reduce_handler`,
# which takes the maximum of `found_inf` over all shards (`torch/distributed/tensor/_dispatch.py`).
# FSDP1 needed its own `ShardedGradScaler` for this; FSDP2 does not. The run below puts an inf
# into rank 1's gradient shard at step 3 (`--inf-at 3`), and only there:

# %%
assert hasattr(dtensor_dispatch, "found_inf_reduce_handler")
run["fp16"] = work / "fp16.json"
print(torchrun(SCRIPT, "--preset", "smoke", "--device", "cpu", "--param-dtype", "fp16",
               "--steps", "8", "--inf-at", "3", "--summary", str(run["fp16"])))
fp16 = json.loads(run["fp16"].read_text())
assert fp16["grad_scaler"] and fp16["output_dtype"] == "fp16"
assert fp16["skipped_steps"] == [1, 1] and fp16["final_scale"] == 2.0**15  # both skipped step 3
assert fp16["losses"][-1] < fp16["losses"][0]
print(f"steps skipped per rank: {fp16['skipped_steps']}; scale 65536 -> {fp16['final_scale']:.0f}")

# %% [markdown]
# ## 5. Memory per process, beside DDP's
#
# DDP keeps the whole fp32 model, its gradients and AdamW's two moments on every process (and
# its gradient buckets, one more gradient-sized buffer unless `gradient_as_bucket_view=True`).
# FSDP2 keeps 1/N of each, plus, while a block computes, that block and the root's parameters
# gathered whole in 16 bits. The first three rows are counted from the tensors (each process's
# shards, `DTensor.to_local()`, without FSDP2's padding of the last shard); DDP's from a plain
# model after one AdamW step. The gathered row is computed from the sizes, and a lower bound.

# %%
model = fresh_model()
optimizer = torch.optim.AdamW(model.parameters())
sequence_loss(model(tokens), targets).backward()
optimizer.step()
ddp = state_bytes(model, optimizer)
memory = pd.DataFrame({"DDP, each process": ddp,
                       **{f"FSDP2, rank {r}": held for r, held in enumerate(first["state_bytes"])}})
memory.loc["gathered block + root (16-bit, at least)"] = [0, *[first["unsharded_unit_bytes"]] * 2]
memory.loc["total"] = memory.sum()
display((memory / 2**10).round(1).rename(columns=lambda c: c + " (KiB)"))
for kind in ddp:  # the two shards together are exactly the whole
    assert sum(held[kind] for held in first["state_bytes"]) == ddp[kind]

# %% [markdown]
# At 2 processes each holds half of the fp32 state, plus the gathered 16-bit parameters; at N the
# state shrinks as 1/N while the gathered part does not. That row is the least of it: the root
# stays gathered from its forward until backward, backward gathers the next block ahead
# (prefetch), the block being reduced has 16-bit gradients and an fp32 reduce buffer, and
# activations come on top. On a GPU the script records each process's allocator peak
# (`device_peak_bytes` in its summary), which counts them all.
#
# ## 6. A sharded checkpoint, resumed exactly
#
# `torch.distributed.checkpoint` writes each process's shards itself (no gather to one process),
# from `get_state_dict(model, optimizer)`; the step and the scaler's state are rank 0's JSON
# beside them. A second job that starts from the checkpoint written after step 12 must end with
# the same weights, bit for bit, as the run that went on. (Bit for bit needs the same number of
# processes and deterministic kernels: DCP loads the shards into any number of processes, but
# another reduction order changes the last bits.)

# %%
run["b"] = work / "b.json"
print(torchrun(SCRIPT, "--preset", "smoke", "--device", "cpu", "--param-dtype", "bf16",
               "--steps", "24", "--resume", str(run["ckpt"]), "--summary", str(run["b"])))
resumed = json.loads(run["b"].read_text())
assert resumed["start_step"] == 12 and resumed["losses"] == first["losses"][12:]
assert resumed["param_hash"] == first["param_hash"]  # the same weights, gathered whole
print(f"resumed at step 12: the same 12 losses, the same weights ({first['param_hash'][:16]}...)")

# %% [markdown]
# **FP8.** torchao's float8 training (lesson 16) has an FSDP2 option:
# `Float8LinearConfig(enable_fsdp_float8_all_gather=True)` casts each shard to float8 before the
# all-gather, half of bf16's bytes. It is not run here: it pays only where FP8 matmuls are fast,
# on GPUs with FP8 units (NVIDIA compute capability 8.9+, AMD MI300 and later).
#
# **On GPUs and across nodes**, the same script, one process per GPU (NCCL; RCCL on ROCm):
#
# ```
# torchrun --standalone --nproc-per-node 8 scripts/train_fsdp.py --param-dtype bf16
# torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
#     scripts/train_fsdp.py --param-dtype bf16      # the same line on each node
# ```

# %% [markdown]
# ## Try it
#
# 1. **The policy at fp32.** In section 1, set `policy = MixedPrecisionPolicy(param_dtype=
#    torch.float32)` and rerun the two cells. Predict the `policy` column: every op in fp32, and
#    the first assert of the next cell fails, since the policy no longer casts anything.
# 2. **Four processes.** In section 4, add `processes=4` to the `torchrun(...)` call. Predict
#    the steps skipped per rank: `[1, 1, 1, 1]`, although only rank 3 saw the inf, and the
#    assert written for two ranks fails. With `processes=3` the script refuses: the `smoke`
#    batch of 32 sequences does not split over 3 processes.

# %% [markdown]
# ## What to remember
#
# - FSDP2's `MixedPrecisionPolicy(param_dtype)` casts the **parameters** (each shard, before the
#   all-gather), so a whole block computes in 16 bits; autocast casts **per op**. Together,
#   autocast's fp32 list still applies.
# - The shards the optimizer updates stay fp32; `reduce_dtype=torch.float32` rounds the gradient
#   sum only to fp32, bf16 to 8 significant bits.
# - fp16 works with a plain `torch.amp.GradScaler`: DTensor makes every process see the same
#   `found_inf`. Checkpoints: `torch.distributed.checkpoint`, with the scaler's state beside.
