"""The figures the lessons share: titled, labelled, one idea per figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def plot_dtype_ranges(dtypes: Sequence[torch.dtype] = FLOAT_DTYPES) -> Figure:
    """Log2 of the smallest subnormal, smallest normal and largest value of each dtype.
    """
    from amp_tutorial.device import dtype_name

    fig, ax = plt.subplots(figsize=(9, 3))
    for row, dtype in enumerate(dtypes):
        fi = torch.finfo(dtype)
        low, normal, high = np.log2([fi.smallest_normal * fi.eps, fi.smallest_normal, fi.max])
        ax.plot([low, normal], [row, row], color="tab:orange", lw=6, solid_capstyle="butt",
                label="subnormal" if row == 0 else None)
        ax.plot([normal, high], [row, row], color="tab:blue", lw=6, solid_capstyle="butt",
                label="normal" if row == 0 else None)
        ax.text(high + 3, row, f"eps = 2^{int(np.log2(fi.eps))}", va="center", fontsize=8)
    ax.set_yticks(range(len(dtypes)), [dtype_name(d) for d in dtypes])
    ax.set_xlabel("magnitude (log2 scale, powers of two)")
    ax.set_title("Representable magnitudes by dtype")
    ax.legend(loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_image(image: torch.Tensor | np.ndarray, title: str) -> Figure:
    """One (H, W) or (1, 1, H, W) image, such as the target, with a colour bar.
    """
    fig, ax = plt.subplots(figsize=(5, 4))
    shown = ax.imshow(_as_2d(image), cmap="viridis", origin="lower", extent=(0, 1, 0, 1))
    ax.set(xlabel="x (normalised)", ylabel="y (normalised)")
    fig.suptitle(title)
    fig.colorbar(shown, ax=ax, label="target value (0 to 1)")
    fig.tight_layout()
    return fig


def plot_outputs(images: Mapping[str, torch.Tensor | np.ndarray], title: str) -> Figure:
    """Images side by side on one colour scale: the target next to each run's prediction.
    """
    fig, axes = plt.subplots(1, len(images), figsize=(3.3 * len(images), 3.4), squeeze=False)
    for ax, (name, image) in zip(axes[0], images.items(), strict=True):
        ax.imshow(_as_2d(image), cmap="viridis", origin="lower", extent=(0, 1, 0, 1),
                  vmin=0, vmax=1)
        ax.set(title=name, xlabel="x (normalised)")
    axes[0][0].set_ylabel("y (normalised)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_losses(histories: Mapping[str, Sequence[float]], title: str = "Training loss",
                xlabel: str = "step", ylabel: str = "MSE loss (log scale)") -> Figure:
    """Loss per step (or per ``xlabel``, e.g. epoch) for each run, log scale; pass ``ylabel`` for
    another loss (the transformer's cross-entropy).
    """
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, losses in histories.items():
        ax.plot(range(1, len(losses) + 1), losses, label=name)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel, yscale="log")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_bars(values: Mapping[str, Mapping[str, float]], title: str) -> Figure:
    """One panel per metric (e.g. 'time per step (ms)'), one bar per run, value printed on top.
    """
    metrics = list(values)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.3), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        runs = values[metric]
        bars = ax.bar(list(runs), list(runs.values()),
                      color=["tab:gray", "tab:blue", "tab:green", "tab:orange"][: len(runs)])
        ax.bar_label(bars, fmt="%.3g")
        ax.set(title=metric, ylabel=metric)
        ax.margins(y=0.15)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _as_2d(image: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(image, torch.Tensor):
        image = image.detach().float().cpu().numpy()
    return np.asarray(image).reshape(image.shape[-2], image.shape[-1])


def plot_op_times(rows: Sequence[Mapping[str, object]], title: str, top: int = 15) -> Figure:
    """Self time of the ``top`` ops of a profiled step, one bar per (op, input dtypes), coloured by
    whether any input was low precision (rows from ``measure.op_dtype_rows``).
    """
    shown = list(rows)[:top][::-1]
    colours = ["tab:green" if any(d in str(r["input dtypes"]) for d in ("bf16", "fp16"))
               else "tab:gray" for r in shown]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(shown) + 1.5))
    ax.barh([f"{r['op']} ({r['input dtypes']})" for r in shown],
            [float(r["self time (us)"]) / 1e3 for r in shown], color=colours)
    ax.set(title=title, xlabel="self time in the step (ms)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="tab:green"),
                       plt.Rectangle((0, 0), 1, 1, color="tab:gray")],
              labels=["low-precision input", "float32 inputs only"], fontsize=8, loc="lower right")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    return fig


def plot_gradient_magnitudes(grads: torch.Tensor, scale: float, title: str) -> Figure:
    """Histogram of log2 |gradient| (zeros left out), and the same times ``scale``, against
    float16's smallest subnormal and normal numbers and the band that rounds to 0.
    """
    fp16 = torch.finfo(torch.float16)
    subnormal, normal = fp16.smallest_normal * fp16.eps, fp16.smallest_normal
    magnitudes = np.log2(grads[grads != 0].abs().float().cpu().numpy())
    shift = np.log2(scale)
    bins = np.arange(np.floor(magnitudes.min()), np.ceil(magnitudes.max()) + shift + 1, 0.5)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.hist(magnitudes, bins=bins, alpha=0.7, label="true gradients (fp32)")
    ax.hist(magnitudes + shift, bins=bins, alpha=0.7,
            label=f"x 2^{shift:g} (what GradScaler feeds fp16)")
    ax.axvspan(bins[0], np.log2(subnormal / 2), color="tab:red", alpha=0.12,
               label="rounds to 0 in fp16 (below 2^-25)")
    ax.axvline(np.log2(subnormal), color="tab:red", ls="--", label="fp16 smallest subnormal")
    ax.axvline(np.log2(normal), color="tab:orange", ls="--", label="fp16 smallest normal")
    ax.set(title=title, xlabel="gradient magnitude (log2; -24 is about 6e-8)",
           ylabel="number of gradient values")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_scale_history(scales: Sequence[float], skipped: Sequence[bool], title: str,
                       marked_step: int | None = None) -> Figure:
    """A GradScaler's scale per step (log2) with the skipped steps marked.

    ``scales`` has one entry per step (the scale that step used) plus the final one;
    ``marked_step`` draws a vertical line, e.g. where an inf was injected.
    """
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(range(len(scales)), np.log2(scales), where="post", label="scale used by the step")
    skips = [s for s, skip in enumerate(skipped) if skip]
    ax.scatter(skips, np.log2([scales[s] for s in skips]), color="tab:red", zorder=3,
               label="skipped step (inf/NaN gradient)")
    if marked_step is not None:
        ax.axvline(marked_step, color="tab:red", ls=":", label="inf injected")
    ax.set(title=title, xlabel="training step", ylabel="scale (log2)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
