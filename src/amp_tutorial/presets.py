"""Problem-size presets, so every lesson runs in sensible time on a GPU, a laptop CPU and in CI.

``paper`` reproduces the sizes of the original ROCm blog; ``cpu`` is the laptop size; ``smoke`` is
the tiny size the test suite uses. Each preset also sizes the course's transformer
(:class:`TransformerSizes`). ``auto`` picks ``paper`` on a GPU and ``cpu`` elsewhere.
Set ``AMP_TUTORIAL_PRESET`` to override.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PRESET_ENV = "AMP_TUTORIAL_PRESET"


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
               description="a laptop CPU: 20-30 s per fp32 training run on 2 cores; bf16 several "
                           "times longer on a CPU without native bf16 (AVX2 only); the "
                           "transformer is sized so that such a CPU trains it in a few minutes",
               # Sized for a CPU that emulates bf16 (AVX2, no avx512_bf16/AMX): there PyTorch's bf16
               # matmul skips oneDNN and falls back to ATen's reference gemm, 1.5-35x slower than
               # fp32 depending on the operands' layout, so the bf16 run sets the lesson's time.
               # `bench --model transformer --preset cpu` on a 2-core AVX2 EPYC (Zen 3), shared:
               # 18 ms (fp32) and 175 ms (bf16) per step, 56 s in all; both runs reach 1.0 held-out
               # accuracy (they pass 0.9 between steps 50 and 100). The old size (d_model 256,
               # 4 layers, seq 256) took about 5 s (fp32) and 90 s (bf16) per step on that CPU; it
               # is the size where bf16 was 2.5x faster on an avx512_bf16 EPYC (GUIDE.md). At this
               # size bf16 is not expected to beat fp32 even with native bf16 (not measured).
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


def get_preset(name: str | None = None, device_type: str | None = None) -> Preset:
    """Return the preset called ``name`` (or ``$AMP_TUTORIAL_PRESET``, or ``auto``).

    ``auto`` resolves to ``paper`` on cuda/xpu and ``cpu`` on cpu/mps.
    """
    chosen = (name or os.environ.get(PRESET_ENV) or "auto").strip().lower()
    if chosen == "auto":
        if device_type is None:
            from amp_tutorial.device import select_device

            device_type = select_device().type
        chosen = "paper" if device_type in ("cuda", "xpu") else "cpu"
    if chosen not in PRESETS:
        source = "argument" if name else f"${PRESET_ENV}"
        raise UnknownPresetError(
            f"unknown preset {chosen!r} (from the {source}); valid names: {', '.join(VALID_NAMES)}"
        )
    return PRESETS[chosen]
