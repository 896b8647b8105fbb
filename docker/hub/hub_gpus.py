"""How the workshop hub hands GPUs to the learners' containers (read by jupyterhub_config.py).

The instructor picks a sharing mode with AMP_HUB_GPUS:
  all   every learner's container sees every GPU of the server (the default on a GPU variant;
        small course models share a GPU well, and `torch.cuda.set_per_process_memory_fraction`
        is not needed at the course's sizes)
  each  each learner gets one GPU: the one with the fewest learners on it when their server
        starts, so thirty learners on eight GPUs means four on each
  none  no GPU (the default on the cpu variant)
and, for `each`, which GPUs with AMP_HUB_GPU_IDS: NVIDIA device indices or UUIDs as `nvidia-smi -L`
lists them ("0,1,2,3"), or AMD render nodes as `ls /dev/dri` lists them ("renderD128,renderD136").

Devices are passed the way each vendor documents for `docker run`: NVIDIA through a device request
to the NVIDIA Container Toolkit (`--gpus`), AMD by passing /dev/kfd and the GPU's render node
(`--device`), with the host's group numbers of those files added to the learner's groups.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

VENDORS = {"cuda": "nvidia", "rocm": "amd", "cpu": None}
MODES = ("all", "each", "none")


def vendor_of(variant: str) -> str | None:
    """The GPU vendor of a course image variant (AMP_TUTORIAL_VARIANT)."""
    if variant not in VENDORS:
        raise ValueError(f"AMP_TUTORIAL_VARIANT={variant!r}: expected one of {sorted(VENDORS)}")
    return VENDORS[variant]


def least_used(gpu_ids: list[str], in_use: Iterable[str]) -> str:
    """The GPU with the fewest learners on it; on a tie, the first in `gpu_ids`."""
    if not gpu_ids:
        raise ValueError("AMP_HUB_GPUS=each needs AMP_HUB_GPU_IDS, the GPUs to hand out")
    load = Counter(in_use)
    return min(gpu_ids, key=lambda gpu: (load[gpu], gpu_ids.index(gpu)))


def host_config(vendor: str | None, gpu: str | None, group_ids: list[str]) -> dict[str, Any]:
    """docker-py host-config settings giving a container one GPU (`gpu`) or all of them (None)."""
    if vendor is None:
        return {}
    if vendor == "nvidia":
        request: dict[str, Any] = {"Driver": "nvidia", "Capabilities": [["gpu"]]}
        request |= {"DeviceIDs": [gpu]} if gpu is not None else {"Count": -1}
        return {"device_requests": [request], "shm_size": "8g"}
    if vendor == "amd":
        render = "/dev/dri" if gpu is None else f"/dev/dri/{gpu}"
        return {"devices": ["/dev/kfd:/dev/kfd:rwm", f"{render}:{render}:rwm"],
                "group_add": group_ids, "security_opt": ["seccomp=unconfined"],
                "shm_size": "8g"}
    raise ValueError(f"unknown GPU vendor {vendor!r}")


def parse_mode(mode: str | None, vendor: str | None) -> str:
    """AMP_HUB_GPUS, checked against the variant: `all` on a GPU variant, `none` on cpu."""
    mode = mode or ("none" if vendor is None else "all")
    if mode not in MODES:
        raise ValueError(f"AMP_HUB_GPUS={mode!r}: expected one of {', '.join(MODES)}")
    if vendor is None and mode != "none":
        raise ValueError(f"AMP_HUB_GPUS={mode} needs a GPU image: set AMP_TUTORIAL_VARIANT to "
                         "cuda or rocm")
    return mode
