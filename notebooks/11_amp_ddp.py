# ---
# jupyter:
#   amp_tutorial:
#     learner_minutes: 10
#     memory:
#       cpu: 1
#       paper: 1
#     minutes:
#       cpu: 0.2
#       small: 0.2
#       smoke: 0.3
#     needs: any device, CPU included; it always runs 2 CPU processes (Gloo); the multi-GPU
#       command it shows needs 2+ GPUs (NCCL/RCCL, XCCL)
#     process_memory:
#       cpu: 18
#       paper: 136
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
# # 11 · AMP on several devices: DistributedDataParallel
#
# Lessons 03 and 05 trained on one device, with one GradScaler, and saved checkpoints with the
# scaler's state. This lesson scales that loop out to several processes with PyTorch's
# DistributedDataParallel (DDP) and shows what changes for AMP (very little) and what DDP itself
# adds (ranks, a sampler per process, who writes the checkpoint).
#
# The run below uses 2 CPU processes at the `smoke` preset on every machine, so it also runs in
# the test suite; the last cell says how to run it on several GPUs.

# %%
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from IPython.display import Markdown, display

from amp_tutorial.checkpoint import load_checkpoint, parameter_hash
from amp_tutorial.device import device_line, select_device
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import get_preset

info = select_device()
print(device_line(info))
scratch = tempfile.TemporaryDirectory(prefix="amp11_")  # removed when the kernel stops
work_dir = Path(scratch.name)  # the DDP run writes its checkpoint and summary here
SCRIPT = Path("../scripts/train_ddp.py").resolve()  # the course's programs sit beside notebooks/
assert SCRIPT.is_file(), f"{SCRIPT} not found: open this lesson from the course's notebooks/ folder"

# %% [markdown]
# ## Several processes: DistributedDataParallel with AMP
#
# Once one device is not enough, the next step is data parallelism with `torch.distributed`:
# one process per device, each holding a full copy of the model and training on its own share of
# the data. After `backward()`, DDP all-reduces the gradients, so every process applies the same
# averaged gradient and the copies stay identical. AMP fits in unchanged:
#
# - autocast goes around the forward pass and loss **of the DDP-wrapped model**, as before;
# - each process has **its own GradScaler**. The gradients it checks are already all-reduced, so
#   an overflow anywhere shows up everywhere and all processes skip the step together;
# - the process group's backend moves the gradients: **NCCL** on NVIDIA GPUs (on ROCm the same
#   `nccl` name uses AMD's RCCL), **Gloo** on CPUs (here with bf16 autocast);
# - a `DistributedSampler` gives each process a different part of the data, and
#   `sampler.set_epoch(epoch)` reshuffles it every epoch (forget it and every epoch repeats the
#   first epoch's order);
# - only rank 0 prints and writes the checkpoint; every process calls
#   `destroy_process_group()` at the end, in a `finally` so that happens on errors too;
# - BatchNorm normalises with each process's *local* batch. On GPUs
#   `nn.SyncBatchNorm.convert_sync_batchnorm` computes the statistics over the global batch
#   instead; PyTorch's SyncBatchNorm does not run on CPU, so there each process keeps its own
#   batch statistics and DDP copies rank 0's running statistics to the others at each forward.
#
# [`scripts/train_ddp.py`](../scripts/train_ddp.py) is such a training script for lesson 03's
# problem, written to be read top to bottom: settings, setup (this process's device, the process
# group, the data), the training loop, and `main`. The image's rows are the dataset. `torchrun`
# starts the processes and tells each its rank:
#
# ```
# torchrun --standalone --nproc-per-node 4 scripts/train_ddp.py --checkpoint runs/ddp.pt
# python scripts/train_ddp.py --preset smoke      # one process, no torchrun
# ```
#
# Every process runs the script's `train`, shown below from the file: per process a
# `DistributedSampler`, the model wrapped in `DistributedDataParallel` and one GradScaler, then
# the loop with the AMP lines of lesson 03 unchanged, then every rank's parameter hash and rank 0's
# files. `main` joins the process group around it and leaves it in a `finally`.

# %%
source = SCRIPT.read_text()
loop = source[source.index("def train("):source.index("\ndef main(")]
display(Markdown(f"`scripts/{SCRIPT.name}`, its training loop:\n\n```python\n{loop}```"))

# %% [markdown]
# Below it runs with 2 CPU processes at the `smoke` preset (`torchrun` is
# `python -m torch.distributed.run`; `--standalone` picks a free port on this machine).
# Rank 0 writes a JSON summary with every rank's hash of its parameters.

# %%
ddp_dir = work_dir / "ddp"
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), "--preset", "smoke", "--device", "cpu",
           "--checkpoint", str(ddp_dir / "model.pt"), "--summary", str(ddp_dir / "summary.json")]
print("$ torchrun", " ".join(command[3:]).replace(str(SCRIPT), "../scripts/train_ddp.py"))
result = subprocess.run(command, capture_output=True, text=True, timeout=600)
print(result.stdout)
assert result.returncode == 0, result.stderr

# %%
summary = json.loads((ddp_dir / "summary.json").read_text())
print(f"{summary['world_size']} processes, backend {summary['backend']}, autocast "
      f"{summary['amp_dtype']}, {summary['steps']} steps; mean loss per epoch "
      f"{[round(x, 4) for x in summary['epoch_losses']]}")
for rank, digest in enumerate(summary["param_hashes"]):
    print(f"rank {rank}: parameters sha256 {digest[:16]}...")
assert summary["world_size"] == 2 and summary["backend"] == "gloo"
assert len(set(summary["param_hashes"])) == 1  # both processes ended with identical parameters
assert summary["epoch_losses"][-1] < summary["epoch_losses"][0]

# The checkpoint rank 0 wrote loads into a plain (unwrapped) model.
smoke = get_preset("smoke")
ddp_trained = ConvModel(smoke.hidden, smoke.n_hidden_layers)
extra = load_checkpoint(ddp_dir / "model.pt", ddp_trained)
assert parameter_hash(ddp_trained) == summary["param_hashes"][0]
print(f"checkpoint: step {extra['step']}, written by rank 0 of {extra['world_size']}")

# %% [markdown]
# On a machine with several GPUs, run the same script with one process per GPU:
# `torchrun --standalone --nproc-per-node $(nvidia-smi -L | wc -l) scripts/train_ddp.py`
# (on ROCm count with `rocm-smi`, or set the number yourself). Each process then uses
# `cuda:LOCAL_RANK`, NCCL/RCCL, fp16 autocast with its own GradScaler, and SyncBatchNorm. On
# Intel GPUs (`--device xpu`) it uses XCCL and the device's first AMP dtype (bf16 where native).

# %% [markdown]
# ## Try it
#
# Each exercise changes one thing in the cell that builds `command`. Predict the outcome, then
# re-run from that cell.
#
# 1. **fp16, one GradScaler per process.** On a CPU, where the run above used bf16, add
#    `"--dtype", "fp16",` to `command`. The log says `autocast fp16, GradScaler on`, every epoch
#    line ends with `scale 32768` (one early step overflowed at 65536 and was skipped, by both
#    processes at once), and the two parameter hashes still match.
# 2. **Three processes.** Change `"--nproc-per-node", "2"` to `"3"`. Each process now takes 2 rows
#    per step, for 2 epochs of 6 steps; the three hashes match, and the next cell stops at its
#    `world_size == 2` check: DDP keeps any number of copies identical.

# %% [markdown]
# ## What to remember
#
# - DDP + AMP: autocast around the forward and loss of the wrapped model, a GradScaler per
#   process (the all-reduced gradients make every process skip the same steps).
# - NCCL (RCCL on ROCm) on GPUs, Gloo on CPUs; `sampler.set_epoch(epoch)` every epoch.
# - Only rank 0 prints and writes the checkpoint; `destroy_process_group()` in a `finally`.
