"""Train the course's transformer with FSDP2 (``fully_shard``) and its mixed-precision policy.

How to run it from the checkout (prefix ``pdm run`` on the host; in the Docker image the file is
``/home/learner/scripts/train_fsdp.py`` and ``torchrun`` is ``docker/torchrun``):

    # two CPU processes: Gloo, bf16 compute, fp32 gradient reduce-scatter
    torchrun --standalone --nproc-per-node 2 scripts/train_fsdp.py --device cpu --preset smoke
    # every GPU of this machine: NCCL (RCCL on ROCm), one GPU per process
    torchrun --standalone --nproc-per-node N scripts/train_fsdp.py --param-dtype bf16
    # several machines: the same command on each, N processes per machine
    torchrun --nnodes 2 --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        scripts/train_fsdp.py
    # one process, no torchrun: a process group of one in memory, the same code path
    python scripts/train_fsdp.py --preset smoke

FSDP2 splits every parameter across the processes (each keeps a 1/N shard in fp32: the
optimizer's master weights). Before a block runs, each process casts its shards to
``param_dtype`` and the 16-bit copies are all-gathered, so the whole block computes in that dtype;
after it the gathered copy is freed again.
In backward the gradients are reduce-scattered in ``reduce_dtype``, and each process's optimizer
updates its own fp32 shard. ``--param-dtype fp16`` adds a GradScaler: DTensor's dispatcher takes
the maximum of ``found_inf`` over the shards, so every process skips the same steps.

The file reads top to bottom: settings, setup (the data and the sharded model; the device and the
process group come from ``amp_tutorial.distributed``), the training loop (``train``), checkpoints
(``torch.distributed.checkpoint``: every process writes its own shards), and ``main``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy

from amp_tutorial.device import dtype_name, select_device
from amp_tutorial.distributed import device_and_preset, init_process_group, script_parser
from amp_tutorial.fsdp import full_parameter_hash, largest_unit_bytes, shard, state_bytes
from amp_tutorial.measure import peak_memory_bytes, reset_peak_memory
from amp_tutorial.nonfinite import check_finite_loss
from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import make_transformer_problem, sequence_loss
from amp_tutorial.transformer import DecoderTransformer

# --- settings ------------------------------------------------------------------------------------

SEED = 0
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TRAIN_STATE = "train_state.json"  # beside the shards: the step reached and the scaler's state


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the options before any process group exists; exit 2 with a clear error."""
    parser = script_parser("train_fsdp.py", __doc__.splitlines()[0])
    parser.add_argument("--param-dtype", choices=["auto", *DTYPES], default="auto",
                        help="MixedPrecisionPolicy.param_dtype, the dtype every sharded block "
                        "computes in; auto = the device's AMP dtype; fp16 adds a GradScaler")
    parser.add_argument("--reduce-dtype", choices=list(DTYPES), default="fp32",
                        help="MixedPrecisionPolicy.reduce_dtype: the gradients' reduce-scatter")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    parser.add_argument("--save-at", type=int, help="the step after which --checkpoint is "
                        "written (default: the last); the run goes on after it")
    parser.add_argument("--lr", type=float, help="AdamW learning rate (default: the preset's)")
    parser.add_argument("--checkpoint", help="directory where every process writes its shards")
    parser.add_argument("--resume", help="a --checkpoint directory to continue from")
    parser.add_argument("--grads", help="where rank 0 writes the first step's full gradients")
    parser.add_argument("--inf-at", type=int, help="put an inf into the last rank's gradient "
                        "shard at this step (fp16): every rank must skip that step")
    parser.add_argument("--summary", help="where rank 0 writes a JSON summary of the run")
    args = parser.parse_args(argv)
    for name in ("steps", "save_at", "inf_at"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.save_at and args.steps and args.save_at > args.steps:
        parser.error(f"--save-at {args.save_at} is after the last step ({args.steps}): the "
                     "checkpoint would never be written")
    if args.resume and not (Path(args.resume) / TRAIN_STATE).is_file():
        parser.error(f"--resume {args.resume}: no {TRAIN_STATE} there; pass a directory that an "
                     "earlier run wrote with --checkpoint")
    args.device_obj, preset, world_size = device_and_preset(parser, args)
    if args.inf_at and param_dtype_for(args.param_dtype, args.device_obj) != torch.float16:
        parser.exit(2, f"{parser.prog}: error: --inf-at needs --param-dtype fp16: only a "
                    "GradScaler skips the step, and without one the inf reaches the weights\n")
    saved = json.loads((Path(args.resume) / TRAIN_STATE).read_text())["step"] if args.resume else 0
    if saved >= (args.steps or preset.transformer.steps):
        parser.exit(2, f"{parser.prog}: error: the checkpoint in {args.resume} is at step {saved}: "
                    "pass a --steps beyond it to train on\n")
    if preset.transformer.batch % world_size:
        parser.exit(2, f"{parser.prog}: error: the {preset.name} preset's batch of "
                    f"{preset.transformer.batch} sequences does not split over {world_size} "
                    "processes; start a number of processes that divides it\n")
    return args


# --- setup: the dtype (the sharded model: amp_tutorial.fsdp.shard) -----------------------------

def param_dtype_for(choice: str, device: torch.device) -> torch.dtype:
    """``--param-dtype``: auto is the device's AMP dtype (fp32 where it has none)."""
    if choice == "auto":
        return select_device(str(device)).amp_dtype or torch.float32
    return DTYPES[choice]


# --- the training loop ---------------------------------------------------------------------------

@dataclass
class Summary:
    """What rank 0 writes as JSON: the setup, the loss per step, memory per rank, the weights' hash.
    """

    world_size: int
    backend: str
    device: str
    param_dtype: str
    reduce_dtype: str
    grad_scaler: bool
    preset: str
    steps: int
    start_step: int
    output_dtype: str = ""  # the logits' dtype
    sharded_param_dtype: str = ""  # the optimizer's (master) copy
    losses: list[float] = field(default_factory=list)  # mean over all ranks, per step
    skipped_steps: list[int] = field(default_factory=list)  # one per rank: GradScaler's skips
    final_scale: float | None = None
    state_bytes: list[dict[str, int]] = field(default_factory=list)  # one per rank
    unsharded_unit_bytes: int = 0
    device_peak_bytes: list[int | None] = field(default_factory=list)  # the allocator's, per rank
    param_hash: str = ""


def train(args: argparse.Namespace) -> Summary:
    """Train with FSDP2 in an initialised process group; every rank returns the same Summary."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = args.device_obj
    preset = get_preset(args.preset, device.type)
    param_dtype = param_dtype_for(args.param_dtype, device)
    reduce_dtype = DTYPES[args.reduce_dtype]
    use_scaler = param_dtype == torch.float16
    log = print if rank == 0 else (lambda *a, **k: None)

    config, batches, _ = make_transformer_problem(preset, device)  # the same batches everywhere
    steps = args.steps or preset.transformer.steps
    if steps > len(batches):
        batches = batches * -(-steps // len(batches))
    torch.manual_seed(SEED)  # the same initial weights on every process, before sharding
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    model = shard(DecoderTransformer(config).to(device), policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr or preset.transformer.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    start = load(args.resume, model, optimizer, scaler) if args.resume else 0
    end = steps

    summary = Summary(world_size=world_size, backend=dist.get_backend(), device=str(device),
                      param_dtype=dtype_name(param_dtype), reduce_dtype=dtype_name(reduce_dtype),
                      grad_scaler=use_scaler, preset=preset.name, steps=end, start_step=start)
    log(f"FSDP2: {world_size} process(es), backend {summary.backend}, device type {device.type}, "
        f"param_dtype {summary.param_dtype}, reduce_dtype {summary.reduce_dtype}, GradScaler "
        f"{'on' if use_scaler else 'off'}; preset {preset.name}, steps {start + 1}-{end} of "
        f"{steps}")
    reset_peak_memory(device)
    skipped = 0
    for step in range(start, end):
        inputs, targets = (t.chunk(world_size)[rank] for t in batches[step])  # this rank's share
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)  # each block casts its shards to param_dtype, all-gathers them
        loss = sequence_loss(logits, targets)
        scaler.scale(loss).backward()  # gradients reduce-scattered in reduce_dtype
        if step + 1 == args.inf_at and rank == world_size - 1:
            next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")  # this shard only
        if args.grads and step == start:
            write_gradients(args.grads, model, scaler, optimizer, rank)
        scale = scaler.get_scale() if use_scaler else None
        scaler.step(optimizer)  # each process updates its own fp32 shard
        scaler.update()
        skipped += use_scaler and scaler.get_scale() < scale
        mean_loss = loss.detach().float()
        dist.all_reduce(mean_loss)
        summary.losses.append(check_finite_loss(mean_loss / world_size, step))
        if args.checkpoint and step + 1 == (args.save_at or end):
            save(args.checkpoint, model, optimizer, scaler, step + 1)
            log(f"checkpoint after step {step + 1}: every process wrote its shards to "
                f"{args.checkpoint}")
        if (step + 1) % max(1, (end - start) // 4) == 0 or step + 1 == end:
            log(f"step {step + 1}/{steps}: loss {summary.losses[-1]:.4f}"
                + (f", scale {scaler.get_scale():.0f}" if use_scaler else ""))

    summary.output_dtype = dtype_name(logits.dtype)
    summary.sharded_param_dtype = dtype_name(next(model.parameters()).dtype)
    summary.final_scale = scaler.get_scale() if use_scaler else None
    summary.unsharded_unit_bytes = largest_unit_bytes(model, param_dtype)
    per_rank: list[object] = [None] * world_size
    dist.all_gather_object(per_rank, (state_bytes(model, optimizer), peak_memory_bytes(device),
                                      int(skipped)))
    summary.state_bytes = [held for held, _, _ in per_rank]
    summary.device_peak_bytes = [peak for _, peak, _ in per_rank]
    summary.skipped_steps = [count for _, _, count in per_rank]
    summary.param_hash = full_parameter_hash(model)
    if rank == 0 and args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(asdict(summary), indent=2))
        log(f"summary written to {args.summary}")
    return summary


def write_gradients(path: str, model: nn.Module, scaler: torch.amp.GradScaler,
                    optimizer: torch.optim.Optimizer, rank: int) -> None:
    """Rank 0 writes the step's gradients, unscaled and gathered whole (every rank gathers)."""
    scaler.unscale_(optimizer)  # a no-op when the scaler is off; step() will not unscale twice
    grads = {name: p.grad.full_tensor().float().cpu() for name, p in model.named_parameters()}
    if rank == 0:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(grads, path)


# --- checkpoints: every process writes and reads its own shards ---------------------------------

def save(directory: str, model: nn.Module, optimizer: torch.optim.Optimizer,
         scaler: torch.amp.GradScaler, step: int) -> None:
    """Model and optimizer shards through ``torch.distributed.checkpoint``; the step and the
    scaler's state (the same on every process) as JSON from rank 0."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    if dist.get_rank() == 0:
        state = {"step": step, "scaler": scaler.state_dict()}
        (Path(directory) / TRAIN_STATE).write_text(json.dumps(state))
    dist.barrier()


def load(directory: str, model: nn.Module, optimizer: torch.optim.Optimizer,
         scaler: torch.amp.GradScaler) -> int:
    """Load what ``save`` wrote into the freshly sharded model; returns the step to go on from."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory)  # in place, each process its own shards
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    saved = json.loads((Path(directory) / TRAIN_STATE).read_text())
    if saved["scaler"]:
        scaler.load_state_dict(saved["scaler"])
    return saved["step"]


def main(argv: list[str] | None = None) -> int:
    """Settings, setup, the loop; the process group is always left, also when training fails."""
    args = parse_args(argv)
    init_process_group(args.device_obj)
    try:
        train(args)
        gc.collect()  # see train_ddp.py: a Gloo rank could abort at exit without it
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # leave without the interpreter's teardown, as train_ddp.py does
