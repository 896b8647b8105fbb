"""Answers the course measured on quiet machines, shown beside a learner's own comparison where
theirs is too wide to state: the learner always leaves with a number, and knows which is theirs.

Each answer names its machine, date, preset, torch and how it was timed; where it came from is
in docs/benchmark.md (CPUs) and docs/gpu-register.md (GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amp_tutorial.device import DeviceInfo
    from amp_tutorial.interleave import PairedComparison
    from amp_tutorial.measure import Comparison

    Stated = Comparison | PairedComparison


@dataclass(frozen=True)
class Recorded:
    """One recorded answer to one of the lessons' comparisons."""

    question: str  # e.g. "03 train bf16": lesson, what was timed, the AMP dtype
    device_type: str  # "cpu", "cuda"
    native_bf16: bool | None  # for a CPU: bf16 in hardware (None: not a CPU)
    machine: str
    date: str
    preset: str
    torch: str
    answer: str  # the ratio as stated, t_fp32 / t, with its interval where it has one
    method: str

    def __str__(self) -> str:
        return (f"{self.answer} on {self.machine}, preset {self.preset}, torch {self.torch}, "
                f"{self.date} ({self.method})")


_INTERLEAVED = "interleaved blocks, 90% interval"
_SEPARATE = "separate runs, medians, the machine to itself"
# (device type, native bf16, machine)
_ZEN3 = ("cpu", False, "a 2-core AMD EPYC Zen 3 (AVX2; bf16 emulated)")
_ZEN4 = ("cpu", True, "a 2-core AMD EPYC Zen 4 (AVX512-BF16, no AMX)")
_XEON = ("cpu", True, "a 2-core Intel Xeon (AVX512-BF16, AMX)")
_H100 = ("cuda", None, "an NVIDIA H100 80GB (fp32 with TF32 convolutions)")
_H200 = ("cuda", None, "an NVIDIA H200 SXM (fp32 with TF32 convolutions)")
_LADDER = "the ladder's rungs one after another, medians (docs/runs)"
# question, machine, date, preset, torch, answer, method
RECORDED: tuple[Recorded, ...] = tuple(Recorded(q, *m, *rest) for q, m, *rest in (
    ("03 train bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "0.13x (0.13-0.14) per core, one "
     "thread", _INTERLEAVED),
    ("03 train bf16", _ZEN4, "2026-11-24", "cpu", "2.14.1", "2.00x", _SEPARATE),
    ("03 train bf16", _XEON, "2026-11-26", "cpu", "2.14.1", "2.10-2.17x over three runs",
     _SEPARATE),
    ("04 infer bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "0.10x (0.08-0.11) per core, one "
     "thread", _INTERLEAVED),
    ("04 infer bf16", _ZEN4, "2026-11-26", "cpu", "2.14.1", "2.46x", _SEPARATE),
    ("04 infer bf16", _XEON, "2026-11-26", "cpu", "2.14.1", "2.41-2.84x over three runs",
     _SEPARATE),
    ("03 train fp16", _H100, "2026-11-27", "paper", "2.11.0", "1.43x", _SEPARATE),
    ("03 train bf16", _H100, "2026-11-27", "paper", "2.11.0", "1.39x", _SEPARATE),
    ("03 train fp16", _H200, "2026-11-27", "paper", "2.11.0", "1.34x", _SEPARATE),
    ("03 train bf16", _H200, "2026-11-27", "paper", "2.11.0", "1.30x", _SEPARATE),
    ("12 train bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "0.13x (0.13-0.13), two threads",
     _INTERLEAVED),
    ("12 train bf16", _ZEN4, "2026-11-26", "cpu", "2.14.1", "1.67x", _SEPARATE),
    ("12 train bf16", _XEON, "2026-11-26", "cpu", "2.14.1", "2.08-2.24x over three runs",
     _SEPARATE),
    ("12 train fp16", _H100, "2026-11-27", "paper", "2.11.0", "2.99x", _SEPARATE),
    ("12 train bf16", _H100, "2026-11-27", "paper", "2.11.0", "3.00x", _SEPARATE),
    ("12 train fp16", _H200, "2026-11-27", "paper", "2.11.0", "3.48x", _SEPARATE),
    ("12 train bf16", _H200, "2026-11-27", "paper", "2.11.0", "3.55x", _SEPARATE),
    ("13 fp32 math", _ZEN3, "2026-12-07", "small", "2.14.1", "0.61x (0.59-0.63) per core, one "
     "thread", _INTERLEAVED),
    ("13 bf16 math", _ZEN3, "2026-12-07", "small", "2.14.1", "1.70x (1.61-1.86) per core, one "
     "thread", _INTERLEAVED),
    ("14 ConvModel compiled fp32", _ZEN3, "2026-12-07", "small", "2.14.1", "0.84x, two threads",
     _INTERLEAVED),
    ("14 ConvModel compiled bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "1.06x, two threads",
     _INTERLEAVED),
    ("14 transformer compiled fp32", _ZEN3, "2026-12-07", "small", "2.14.1", "1.06x, two "
     "threads", _INTERLEAVED),
    ("14 transformer compiled bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "1.04x, two "
     "threads", _INTERLEAVED),
    ("15 cast once bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "1.00x (0.98-1.01), two "
     "threads", _INTERLEAVED),
    ("16 fp8", _H100, "2026-11-27", "paper", "2.11.0", "0.78x (FP8 26.4 ms/step, bf16 20.7), "
     "compiled", _SEPARATE),
    ("17 bf16", _ZEN3, "2026-12-07", "small", "2.14.1", "0.13x (0.13-0.14), two threads",
     _INTERLEAVED),
    ("17 bf16 + fused AdamW", _ZEN3, "2026-12-07", "small", "2.14.1", "0.13x (0.13-0.14), two "
     "threads", _INTERLEAVED),
    ("17 bf16", _ZEN4, "2026-12-06", "cpu", "2.14.1", "1.66x", _LADDER),
    ("17 bf16 + fused AdamW", _ZEN4, "2026-12-06", "cpu", "2.14.1", "1.73x", _LADDER),
    ("17 bf16", _XEON, "2026-11-29", "cpu", "2.14.1", "2.49x", _LADDER),
    ("17 bf16 + fused AdamW", _XEON, "2026-11-29", "cpu", "2.14.1", "2.70x", _LADDER),
    ("17 fp16", _H200, "2026-11-27", "paper", "2.11.0", "2.49x", _LADDER),
    ("17 fp16 + fused AdamW", _H200, "2026-11-27", "paper", "2.11.0", "2.81x", _LADDER),
))


def recorded_answers(question: str, info: DeviceInfo) -> list[Recorded]:
    """The recorded answers to ``question`` from machines like this one: the same device type,
    and for a CPU the same kind of bf16 (native or emulated): an emulated bf16 step runs several
    times slower than fp32 where a native one runs faster, so the other kind's answer would
    mislead (none, where none of this kind was recorded)."""
    return [r for r in RECORDED if r.question == question and r.device_type == info.type
            and (info.type != "cpu" or r.native_bf16 == info.native_bf16)]


def with_recorded(comparison: Stated, question: str, info: DeviceInfo) -> str:
    """``comparison``'s sentence; where it states no ratio, each answer recorded for
    ``question`` on a machine like this one (``recorded_answers``) on a line of its own."""
    lines = [str(comparison)]
    if comparison.stated is None:
        lines += [f"    recorded: {answer}" for answer in recorded_answers(question, info)]
    return "\n".join(lines)
