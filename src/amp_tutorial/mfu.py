"""Model FLOPs utilization (MFU): how much of what the hardware can do a training step uses.

A step's *model FLOPs* are the floating-point operations of its forward and backward pass,
counted by PyTorch's ``torch.utils.flop_counter.FlopCounterMode`` on ``meta`` tensors (shapes
only, nothing computed), so no formula is written by hand. The optimizer's and the loss scaler's
arithmetic is not counted, as in PaLM's definition of MFU (Chowdhery et al. 2022, appendix B):
achieved model FLOP/s over the hardware's peak. Attention is counted as its two full matmuls
(``bmm``), also for a causal mask, where a kernel may skip half; that is the common convention.

Two limits each figure is read against:

- the **datasheet peak** of the dtype the step computes in (dense, without sparsity), for the
  GPUs in :data:`PEAKS`; none for a CPU or a GPU not in the table;
- the **measured matmul rate** of that dtype on this device (``amp_tutorial.ceiling``), which
  every device has: the best a matmul-only step could do here, now.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

# the weights' matmuls (linear layers, forward and backward); attention's ``bmm`` (what
# scaled_dot_product_attention decomposes into on ``meta``) is left out of them: on the device
# it runs in the attention kernels, whose time the profile counts as attention, not matmul
WEIGHT_MATMULS = ("aten.mm", "aten.addmm")


def op_flops(build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]],
             loss: Callable[..., torch.Tensor]) -> dict[str, int]:
    """Model FLOPs of one training step (forward, loss, backward) per ATen op (``"aten.mm"``),
    counted on ``meta`` tensors.

    ``build()`` makes the model and its inputs; it runs with ``meta`` as the default device, so
    nothing is allocated. ``loss(model, *inputs)`` computes the loss the step backpropagates.
    """
    with torch.device("meta"):
        model, inputs = build()
    with FlopCounterMode(display=False) as counter:
        loss(model, *inputs).backward()
    return {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def step_flops(build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]],
               loss: Callable[..., torch.Tensor]) -> int:
    """Model FLOPs of one training step: ``op_flops`` summed over the ops."""
    return sum(op_flops(build, loss).values())


@dataclass(frozen=True)
class Peak:
    """A GPU's dense peak TFLOP/s per compute dtype, from its maker's datasheet."""

    name: str
    tflops: dict[str, float]  # "fp32" (CUDA cores), "tf32", "bf16", "fp16" (tensor cores)
    source: str


# Dense figures: NVIDIA's datasheets list tensor-core rates "with sparsity", twice these (the
# H100 PCIe's 1,513 TFLOP/s bf16 is 756.5 dense). The H200 has the H100's compute (SXM and NVL
# alike); only its memory differs. A GH200 (Grace Hopper: its device name holds "H200" or
# "H100" too) is none of these boards, with its own power limit: it gets no row, so no MFU.
_SXM = {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}
_NVL = {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}
_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
PEAKS: tuple[tuple[str, Peak], ...] = (
    (r"(?<!G)H200 NVL", Peak("NVIDIA H200 NVL", _NVL, f"{_H200} (H200 NVL column)")),
    (r"(?<!G)H200", Peak("NVIDIA H200 SXM", _SXM, f"{_H200} (H200 SXM column)")),
    (r"(?<!G)H100 NVL", Peak("NVIDIA H100 NVL", _NVL, f"{_H100} (H100 NVL column)")),
    (r"(?<!G)H100 PCIe", Peak("NVIDIA H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5,
                                                    "fp16": 756.5}, f"{_H100} (H100 PCIe column)")),
    (r"(?<!G)H100", Peak("NVIDIA H100 SXM", _SXM, f"{_H100} (H100 SXM column)")),
    (r"A100", Peak("NVIDIA A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                   "https://www.nvidia.com/en-us/data-center/a100/ (NVIDIA A100 datasheet)")),
    (r"MI300X", Peak("AMD Instinct MI300X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4,
                                             "fp16": 1307.4},
                     "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html")),
)


def peak_for(device_name: str, device_type: str) -> Peak | None:
    """The datasheet peaks of the GPU ``torch.cuda.get_device_name()`` calls ``device_name``;
    None on a CPU (no single peak: it follows the cores, clocks and vector units) or for a GPU
    the table does not list."""
    if device_type != "cuda":
        return None
    return next((peak for pattern, peak in PEAKS if re.search(pattern, device_name)), None)


def compute_dtype(amp_dtype: str | None, tf32: bool) -> str:
    """The dtype whose peak a step is read against: the AMP dtype (``"bf16"``, ``"fp16"``), or
    ``"tf32"`` for an fp32 step whose matmuls use TF32, else ``"fp32"``."""
    return amp_dtype or ("tf32" if tf32 else "fp32")


@dataclass(frozen=True)
class Utilization:
    """One step's achieved rate and its share of the two limits (None where a limit is unknown).
    """

    flops: int  # model FLOPs per step
    seconds: float  # median step time
    peak_tflops: float | None  # the datasheet's dense peak of the compute dtype
    matmul_tflops: float | None  # the measured matmul rate of that dtype on this device

    @property
    def tflops(self) -> float:
        """Achieved model TFLOP/s."""
        return self.flops / self.seconds / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: achieved over the datasheet peak."""
        return None if self.peak_tflops is None else self.tflops / self.peak_tflops

    @property
    def of_matmul(self) -> float | None:
        """Achieved over the measured matmul rate: how close the step gets to a pure matmul."""
        return None if self.matmul_tflops is None else self.tflops / self.matmul_tflops

    def as_dict(self) -> dict[str, float | int | None]:
        return {"flops": self.flops, "tflops": self.tflops, "peak_tflops": self.peak_tflops,
                "mfu": self.mfu, "matmul_tflops": self.matmul_tflops,
                "of_matmul": self.of_matmul}


def percent(share: float | None) -> str:
    """``0.123`` -> ``"12.3%"``; ``"n/a"`` for an unknown share."""
    return "n/a" if share is None else f"{share:.1%}"
