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
))


def recorded_answers(question: str, info: DeviceInfo) -> list[Recorded]:
    """The recorded answers to ``question`` from machines like this one: the same device type,
    and for a CPU the same kind of bf16 (native or emulated) where one was recorded."""
    same_type = [r for r in RECORDED if r.question == question and r.device_type == info.type]
    if info.type != "cpu":
        return same_type
    same_bf16 = [r for r in same_type if r.native_bf16 == info.native_bf16]
    return same_bf16 or same_type
