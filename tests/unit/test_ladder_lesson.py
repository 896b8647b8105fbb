"""Lesson 17's typed record of the H200 ladder agrees with the model's FLOPs and the peaks.

The lesson quotes a GPU run it cannot repeat on a CPU (ms per step, MFU); each MFU it quotes
must follow from its ms per step, the ``paper`` transformer's counted FLOPs and the H200's
datasheet peak, so a figure mistyped or copied from another run fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from amp_tutorial.ladder import BATCH_SCALE
from amp_tutorial.mfu import peak_for, step_flops
from amp_tutorial.presets import get_preset
from amp_tutorial.reversal_task import sequence_loss
from amp_tutorial.transformer import DecoderTransformer, TransformerConfig

LESSON = Path(__file__).resolve().parents[2] / "notebooks" / "17_profiling_amp.py"


def recorded_rows() -> list[tuple[str, list[float], list[float]]]:
    """The H200 table's rows: rung, its ms per step (one or more) and MFU figures in percent."""
    text = LESSON.read_text()
    table = text[text.index("What a GPU run said"):].split("\n#\n")[1]
    rows = []
    for line in table.splitlines()[2:]:
        rung, ms, mfu, _idle = (c.strip() for c in line.removeprefix("# ").split("|")[1:-1])
        rows.append((rung, [float(v) for v in re.findall(r"^\d+\.\d+|(?<=, )\d+\.\d+", ms)],
                     [float(v) for v in re.findall(r"(\d+(?:\.\d+)?)%", mfu)]))
    return rows


def paper_flops() -> int:
    t = get_preset("paper").transformer
    config = TransformerConfig(t.n_symbols + 1, t.seq_len, t.d_model, t.n_layers, t.n_heads)
    return step_flops(lambda: (DecoderTransformer(config), (
        torch.zeros(t.batch, t.seq_len, dtype=torch.long),) * 2),
        lambda m, x, y: sequence_loss(m(x), y))


def test_every_quoted_mfu_follows_from_its_time_flops_and_peak():
    rows = recorded_rows()
    assert len(rows) == 7 and rows[0][0] == "fp32"
    peak = peak_for("NVIDIA H200", "cuda").tflops
    flops = paper_flops()
    scale = 1
    for rung, times, shares in rows:
        scale = BATCH_SCALE if "batch x4" in rung else scale  # the rungs after keep its batch
        assert len(times) == len(shares) >= 1, rung
        for ms, share in zip(times, shares, strict=True):
            top = peak["fp32"] if rung == "fp32" else peak["fp16"]
            mfu = 100 * scale * flops / (ms / 1e3) / 1e12 / top
            # both figures are rounded: ms to 0.1, MFU to 0.1 (fp32's to 1) percentage points
            slack = mfu * 0.05 / ms + (0.5 if rung == "fp32" else 0.05)
            assert abs(mfu - share) <= slack + 1e-9, (rung, ms, share, mfu)
