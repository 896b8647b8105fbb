"""Problem-size presets, so every lesson runs in sensible time on a GPU, a laptop CPU and in CI.

``paper`` reproduces the sizes of the original ROCm blog, for a GPU; ``cpu`` is for a CPU that
computes bf16 natively, ``small`` for one that emulates it (there a bf16 matmul runs many times
slower than fp32, so the sizes are smaller); ``smoke`` is the tiny size the test suite uses. Each
preset also sizes the course's transformer (:class:`TransformerSizes`). ``auto`` picks by what the
machine can do (:func:`auto_preset`); set ``AMP_TUTORIAL_PRESET`` to choose any preset by name.

The float16 + GradScaler demonstrations (lessons 02, 09, 10) run in a narrower network on a CPU
than on a GPU (:func:`fp16_width`); ``AMP_TUTORIAL_GPU_SIZES=1`` runs the GPU's width on a CPU too,
which is how ``python -m course_tools.memory`` counts the memory a GPU's run holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PRESET_ENV = "AMP_TUTORIAL_PRESET"
GPU_SIZES_ENV = "AMP_TUTORIAL_GPU_SIZES"  # "1": a CPU runs the fp16 demonstrations at a GPU's width
GPU_SIZES_CHOICES = {"": False, "0": False, "1": True}
CPU_FP16_WIDTH = 16  # channels of the fp16 demonstrations on a CPU


class UnknownPresetError(ValueError):
    """Raised for a preset name that does not exist; the message lists the valid names.
    """


@dataclass(frozen=True)
class TransformerSizes:
    """Sizes of the course's decoder-only transformer and its sequence-reversal task.
    """

    d_model: int  # width of every token's vector
    n_layers: int
    n_heads: int
    seq_len: int  # tokens per input; the model reverses seq_len // 2 symbols
    batch: int  # sequences per training step
    n_symbols: int  # alphabet of the task (the vocabulary is one larger: + separator)
    steps: int  # training steps (each step sees a fresh batch)
    warmup: int  # untimed steps before timing starts
    lr: float  # AdamW learning rate
    accuracy_target: float  # answer-token accuracy every run must reach on held-out sequences


@dataclass(frozen=True)
class Preset:
    """Sizes for the quantized-sinusoid problem and how long to train and time it.
    """

    name: str
    grid: int  # the input is a grid x grid image with 2 channels (the x, y coordinates)
    hidden: int  # channels of each hidden 1x1 convolution
    n_hidden_layers: int
    steps: int  # training steps (each step sees the whole image)
    warmup: int  # untimed steps before timing starts (kernel selection, allocator growth)
    inference_steps: int  # timed forward passes for the inference comparison
    description: str
    transformer: TransformerSizes  # the transformer lessons and ``bench --model transformer``


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("paper", grid=512, hidden=256, n_hidden_layers=2, steps=512, warmup=10,
               inference_steps=512, description="the seed blog's sizes; for a GPU",
               transformer=TransformerSizes(d_model=512, n_layers=6, n_heads=8, seq_len=512,
                                            batch=32, n_symbols=32, steps=600, warmup=10,
                                            lr=1e-3, accuracy_target=0.95)),
        Preset("cpu", grid=256, hidden=128, n_hidden_layers=2, steps=64, warmup=3,
               inference_steps=32,
               description="a CPU with native bf16 (avx512_bf16, AMX, Arm BF16): sized so that "
                           "bf16 beats fp32 and every lesson takes a few minutes on 2 cores",
               # `bench --preset cpu` on a 2-core AMD EPYC Zen 4 (avx512_bf16, no AMX), freed host
               # memory kept (host_memory.py), 2026-11-24: ConvModel 129.9 -> 64.8 ms per training
               # step (2.00x), 2.18x for inference; this transformer 456 -> 266 ms (1.72x), both
               # runs at 1.000 held-out accuracy (docs/benchmark.md). A bf16 matmul peaks at twice
               # fp32's rate there (VDPBF16PS does two multiply-adds per fp32 lane); AMX (Xeon since
               # Sapphire Rapids) goes further.
               transformer=TransformerSizes(d_model=512, n_layers=2, n_heads=4, seq_len=32,
                                            batch=64, n_symbols=16, steps=40, warmup=3,
                                            lr=1e-3, accuracy_target=0.9)),
        Preset("small", grid=128, hidden=64, n_hidden_layers=2, steps=64, warmup=3,
               inference_steps=32,
               description="a CPU that emulates bf16 (AVX2, no avx512_bf16/AMX): every teaching "
                           "point at sizes where the slow bf16 runs still finish in seconds",
               # Sized from a 2-core AMD EPYC Zen 3 (AVX2 only; GUIDE.md): there PyTorch's bf16
               # matmul skips oneDNN and falls back to ATen's reference gemm (about 0.7 GFLOP/s
               # against fp32's 20), so bf16 trained the ConvModel at 0.16x fp32's speed at grid
               # 256, hidden 128, and this transformer at 175 ms per step. A quarter of the pixels
               # and half the channels cut a ConvModel step about eightfold.
               transformer=TransformerSizes(d_model=64, n_layers=2, n_heads=4, seq_len=64,
                                            batch=16, n_symbols=16, steps=150, warmup=3,
                                            lr=3e-3, accuracy_target=0.9)),
        Preset("smoke", grid=32, hidden=16, n_hidden_layers=1, steps=12, warmup=2,
               inference_steps=6, description="tiny, for the test suite: checks code, not speed",
               transformer=TransformerSizes(d_model=64, n_layers=2, n_heads=2, seq_len=16,
                                            batch=32, n_symbols=10, steps=40, warmup=2,
                                            lr=3e-3, accuracy_target=0.8)),
    )
}
VALID_NAMES = ("auto", *PRESETS)


def auto_preset(device_type: str, cpu_native_bf16: bool | None) -> str:
    """The preset ``auto`` stands for: ``paper`` on a CUDA/ROCm or XPU GPU, ``cpu`` on Apple's
    MPS and on a CPU with native bf16, ``small`` on a CPU without it or whose flags are unknown.
    """
    if device_type in ("cuda", "xpu"):
        return "paper"
    if device_type == "mps" or cpu_native_bf16:
        return "cpu"
    return "small"


def get_preset(name: str | None = None, device_type: str | None = None) -> Preset:
    """Return the preset called ``name`` (or ``$AMP_TUTORIAL_PRESET``, or ``auto``).

    ``auto`` resolves with :func:`auto_preset`; on a CPU it reads the CPU's bf16 flags and asks
    whether PyTorch's oneDNN bf16 kernels are on (``device.cpu_bf16_native``).
    """
    chosen = (name or os.environ.get(PRESET_ENV) or "auto").strip().lower()
    if chosen == "auto":
        from amp_tutorial.device import cpu_bf16_flags, cpu_bf16_native, select_device

        if device_type is None:
            device_type = select_device().type
        native = cpu_bf16_native(cpu_bf16_flags()) if device_type == "cpu" else None
        chosen = auto_preset(device_type, native)
    if chosen not in PRESETS:
        source = "argument" if name else f"${PRESET_ENV}"
        raise UnknownPresetError(
            f"unknown preset {chosen!r} (from the {source}); valid names: {', '.join(VALID_NAMES)}"
        )
    return PRESETS[chosen]


def gpu_sizes_on_cpu() -> bool:
    """Whether ``$AMP_TUTORIAL_GPU_SIZES`` asks a CPU to run a GPU's sizes (``1``; ``0`` or unset:
    no); any other value is an error that lists the valid ones."""
    value = os.environ.get(GPU_SIZES_ENV, "").strip()
    if value not in GPU_SIZES_CHOICES:
        raise ValueError(f"${GPU_SIZES_ENV}={value!r} is not a choice; use 1 (a CPU runs a GPU's "
                         "sizes), 0 or leave it unset")
    return GPU_SIZES_CHOICES[value]


def fp16_width(preset: Preset, device_type: str) -> int:
    """Channels of the network the float16 + GradScaler demonstrations train on ``device_type``.

    The preset's ``hidden`` on a GPU; on a CPU at most ``CPU_FP16_WIDTH``, because CPU float16
    arithmetic is slow (the gradient magnitudes shown depend on the loss and image size, not on
    the width), unless ``$AMP_TUTORIAL_GPU_SIZES`` is ``1``.
    """
    if device_type != "cpu" or gpu_sizes_on_cpu():
        return preset.hidden
    return min(preset.hidden, CPU_FP16_WIDTH)
