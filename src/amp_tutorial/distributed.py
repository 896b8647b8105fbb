"""Joining a process group the same way everywhere: under ``torchrun`` (any number of processes,
on one machine or several), or without it as a process group of one held in memory, so that the
same DDP or FSDP2 code runs in a notebook's kernel, in ``python script.py`` and on a cluster.

``torchrun`` tells each process who it is through the environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); ``distributed_env`` reads it. A process uses
``<device type>:LOCAL_RANK`` on GPUs (``device_for``), and the backend that moves that device's
tensors (``BACKENDS``): NCCL on NVIDIA GPUs (the same ``nccl`` name is AMD's RCCL on ROCm), XCCL
on Intel GPUs, Gloo on CPUs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from amp_tutorial.device import DeviceNotAvailableError, select_device
from amp_tutorial.presets import Preset, UnknownPresetError, get_preset

BACKENDS = {"cuda": "nccl", "cpu": "gloo", "xpu": "xccl"}


class DistributedConfigError(ValueError):
    """A setting that cannot work (device, sizes); raised before any process group exists."""


def distributed_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment, or (0, 0, 1) without it."""
    if "RANK" not in os.environ:
        return 0, 0, 1
    return (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
            int(os.environ["WORLD_SIZE"]))


def device_for(requested: str | None, local_rank: int, world_size: int) -> torch.device:
    """The device this process trains on: the requested type, indexed by the local rank on GPUs."""
    info = select_device(requested)
    if info.type == "cpu":
        return info.device
    if info.type not in BACKENDS:
        raise DistributedConfigError(
            f"torch.distributed has no communication backend for {info.type!r} tensors; use "
            f"--device cpu (or one of {', '.join(BACKENDS)})")
    if world_size > 1 and info.device.index is not None:
        raise DistributedConfigError(
            f"--device {requested} names one GPU, but {world_size} processes need one each: "
            f"pass --device {info.type} (process i uses {info.type}:LOCAL_RANK)")
    count = torch.cuda.device_count() if info.type == "cuda" else torch.xpu.device_count()
    index = info.device.index if info.device.index is not None else local_rank
    if index >= count:
        raise DistributedConfigError(f"local rank {local_rank} has no {info.type} device: {count} "
                                     f"visible; start at most {count} processes per node")
    return torch.device(info.type, index)


def init_process_group(device: torch.device) -> None:
    """Join torchrun's process group (NCCL/RCCL/XCCL on GPUs, Gloo on CPU), or without torchrun
    create a one-process group in memory, so the same code runs unchanged.
    """
    device_id = None
    if device.type != "cpu":
        getattr(torch, device.type).set_device(device)  # torch.cuda / torch.xpu
        device_id = device
    backend = BACKENDS[device.type]
    if "RANK" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device_id)
    else:  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        dist.init_process_group(backend, device_id=device_id)


def script_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The command line every course script launched by torchrun shares: ``--preset``, ``--device``.
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog=f"Launch N processes with: torchrun --standalone --nproc-per-node N scripts/{prog} "
               "[options]")
    parser.add_argument("--preset", help="paper, cpu, small, smoke or auto (default: "
                        "$AMP_TUTORIAL_PRESET or auto)")
    parser.add_argument("--device", help="cuda, xpu or cpu (default: $AMP_TUTORIAL_DEVICE or the "
                        "best available); each process uses <type>:LOCAL_RANK")
    return parser


def device_and_preset(parser: argparse.ArgumentParser,
                      args: argparse.Namespace) -> tuple[torch.device, Preset, int]:
    """This process's device, the preset and the world size, from ``script_parser``'s options and
    torchrun's environment; a setting that cannot work exits 2 with the reason, before any
    process group exists."""
    _, local_rank, world_size = distributed_env()
    try:
        device = device_for(args.device, local_rank, world_size)
        return device, get_preset(args.preset, device.type), world_size
    except (DeviceNotAvailableError, UnknownPresetError, DistributedConfigError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


@contextmanager
def process_group(device: torch.device) -> Iterator[None]:
    """``init_process_group(device)`` for the ``with`` block; the group is destroyed on leaving it,
    also when the block raises (a notebook cell that fails must not leave a group behind)."""
    init_process_group(device)
    try:
        yield
    finally:
        dist.destroy_process_group()


def torchrun(script: Path, *args: str, processes: int = 2, timeout: float = 600) -> str:
    """Run ``script`` under ``torchrun --standalone`` (``python -m torch.distributed.run``; a free
    port on this machine) with ``processes`` processes; print the command and return rank 0's
    output. A failed run raises with the end of its error output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(processes), str(script), *args]
    print(f"$ torchrun --standalone --nproc-per-node {processes} ../scripts/{script.name} "
          + " ".join(a if not Path(a).is_absolute() else Path(a).name for a in args))
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{script.name} failed (exit {result.returncode}):\n"
                           + result.stderr[-3000:])
    return result.stdout
