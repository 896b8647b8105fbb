"""The figures the lessons share: titled, labelled, one idea per figure, one colour per dtype.

Every run is coloured from ``PALETTE`` by the dtype its label names (``colour_for``), so fp32 is
the same blue in a loss curve, a bar and a histogram, in every lesson. ``MARKS`` colours what is
not a run: values lost (flushed to 0, overflowed, a skipped step) and fp16's number bands.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

PALETTE: dict[str, str] = {  # one colour per dtype (matplotlib's tab10, colour-blind ordered)
    "fp32": "#1f77b4",  # blue
    "tf32": "#17becf",  # cyan
    "fp16": "#ff7f0e",  # orange
    "bf16": "#2ca02c",  # green
    "float8_e4m3fn": "#9467bd",  # purple
    "float8_e5m2": "#e377c2",  # pink
    "compiled": "#8c564b",  # brown: a torch.compile run, whatever its dtype
    "other": "#7f7f7f",  # grey: a run whose label names no dtype
}
MARKS: dict[str, str] = {  # colours of things that are not runs
    "lost": "#d62728",  # red: flushed to 0, overflowed to inf, a skipped step
    "subnormal": "#bcbd22",  # olive: fp16's subnormal band (fewer significant bits)
    "normal": "#7f7f7f",  # grey: fp16's normal band
    # where a step's time goes (amp_tutorial.step_profile.GROUPS), in none of the dtypes' colours
    "matmul": "#393b79",  # dark blue
    "attention": "#637939",  # dark olive
    "memory-bound": "#e7ba52",  # gold
    "optimizer": "#843c39",  # dark red
    "idle": "#d9d9d9",  # light grey
    # autocast's rules that name no dtype (plot_autocast_rules); the others take a dtype's colour
    "widest input": "#a55194",  # plum: promote, mixed inputs cast to the widest of them
    "no rule": "#eeeeee",  # near white: on no list, the op runs in the dtype it is given
}

# how labels name each dtype; the earliest name in a label wins ("AMP bf16 (fp32 weights)": bf16)
_NAMES = {
    "float8_e4m3fn": r"e4m3|\bfp8\b|\bfloat8\b",  # plain "FP8": e4m3, the forward format
    "float8_e5m2": r"e5m2",
    "tf32": r"\btf32\b",
    "bf16": r"\bbf16\b|bfloat16",
    "fp16": r"\bfp16\b|(?<!b)float16|\bhalf\b",
    "fp32": r"\bfp32\b|float32",
}


def palette_key(run: str | torch.dtype, default: str | torch.dtype | None = None) -> str:
    """The ``PALETTE`` entry of a run: ``"compiled"`` if its label says so, else the first dtype
    it names ("AMP bf16", "your AMP loop (bfloat16)", torch.float16), else ``default``'s, else
    ``"other"``."""
    label = str(run).replace("torch.", "").lower()
    if "compiled" in label:
        return "compiled"
    found = [(m.start(), key) for key, pattern in _NAMES.items()
             if (m := re.search(pattern, label))]
    if found:
        return min(found)[1]
    return palette_key(default) if default is not None else "other"


def colour_for(run: str | torch.dtype, default: str | torch.dtype | None = None) -> str:
    """The palette colour of a run's label or dtype (see ``palette_key``)."""
    return PALETTE[palette_key(run, default)]


def use_log_scale(values: Sequence[float] | np.ndarray) -> bool:
    """Log axis only when the finite values are all positive and span more than one decade."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    return bool(finite.size and finite.min() > 0 and finite.max() / finite.min() > 10)


def _line_styles(names: Sequence[str], default: str | torch.dtype | None) -> list[dict]:
    """Reference run (the first fp32 one, else the first) solid and wide; the others dashed with
    sparse markers, staggered, so a run identical to another still shows as two lines."""
    keys = [palette_key(n, default) for n in names]
    reference = keys.index("fp32") if "fp32" in keys else 0
    dashes, markers = ["--", "-.", ":"], ["o", "s", "^", "D", "v"]
    styles, drawn_over = [], 0
    for i, key in enumerate(keys):
        if i == reference:
            alone = len(keys) == 1  # nothing to draw over it: an ordinary line
            styles.append({"color": PALETTE[key], "ls": "-", "lw": 2 if alone else 4,
                           "alpha": 1 if alone else 0.5, "zorder": 2})
            continue
        styles.append({"color": PALETTE[key], "ls": dashes[drawn_over % 3], "lw": 1.6,
                       "zorder": 3, "marker": markers[drawn_over % 5], "ms": 5, "mfc": "none"})
        drawn_over += 1
    return styles


def _sparse_markers(style: dict, n: int, index: int) -> dict:
    """About eight markers on a line of ``n`` points, shifted by run so no two runs' coincide."""
    if "marker" not in style:
        return style
    every = max(1, n // 8)
    return {**style, "markevery": (index * every // 3 % every, every)}


def plot_dtype_ranges(dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
                      title: str = "Representable magnitudes by dtype") -> Figure:
    """Log2 of the smallest subnormal, smallest normal and largest value of each dtype (from
    ``torch.finfo``), one bar each: subnormal part olive, normal part in the dtype's colour, the
    smallest subnormal written at its left end, the largest value and eps at its right.
    """
    from amp_tutorial.device import dtype_name

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(dtypes) + 1.9))
    for row, dtype in enumerate(dtypes):
        fi = torch.finfo(dtype)
        low, normal, high = np.log2([fi.smallest_normal * fi.eps, fi.smallest_normal, fi.max])
        ax.plot([low, normal], [row, row], color=MARKS["subnormal"], lw=7, solid_capstyle="butt",
                label="subnormal (fewer significant bits)" if row == 0 else None)
        ax.plot([normal, high], [row, row], color=colour_for(dtype), lw=7,
                solid_capstyle="butt", label="normal (in the dtype's colour)" if row == 0 else None)
        ax.annotate(f"2^{low:.0f}", (low, row), xytext=(-4, 0), textcoords="offset points",
                    ha="right", va="center", fontsize=8)
        largest = f"{fi.max:,.0f}" if fi.max < 1e6 else f"{fi.max:.2g}"
        ax.annotate(f"max {largest}, eps 2^{int(np.log2(fi.eps))}", (high, row), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(dtypes)), [dtype_name(d) for d in dtypes])
    for tick, dtype in zip(ax.get_yticklabels(), dtypes, strict=True):
        tick.set_color(colour_for(dtype))
    ax.set_ylim(len(dtypes) - 0.4, -0.6)  # first dtype on top
    ends = np.log2([[torch.finfo(d).smallest_normal * torch.finfo(d).eps, torch.finfo(d).max]
                    for d in dtypes])
    span = ends.max() - ends.min()
    ax.set_xlim(ends.min() - 0.1 * span, ends.max() + 0.3 * span)  # room for the labels
    ax.set_xlabel("magnitude (log2 scale, powers of two: 2^-24 is about 6e-8)")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncols=2,
              frameon=False)
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
    """Images side by side on one colour scale: the target next to each run's prediction (each
    run's title in its palette colour).
    """
    fig, axes = plt.subplots(1, len(images), figsize=(3.3 * len(images) + 0.5, 3.4),
                             squeeze=False, layout="constrained")
    for ax, (name, image) in zip(axes[0], images.items(), strict=True):
        shown = ax.imshow(_as_2d(image), cmap="viridis", origin="lower", extent=(0, 1, 0, 1),
                          vmin=0, vmax=1)
        key = palette_key(name)
        ax.set(xlabel="x (normalised)")
        ax.set_title(name, color=PALETTE[key] if key != "other" else "black")
    axes[0][0].set_ylabel("y (normalised)")
    fig.colorbar(shown, ax=axes[0].tolist(), label="value (0 to 1, one scale for all)",
                 shrink=0.9)
    fig.suptitle(title)
    return fig


def plot_losses(histories: Mapping[str, Sequence[float]], title: str = "Training loss",
                xlabel: str = "step", ylabel: str = "MSE loss",
                dtype: str | torch.dtype | None = None) -> Figure:
    """Loss per step (or per ``xlabel``, e.g. epoch) for each run, coloured by its dtype (``dtype``
    for labels that name none); the fp32 run solid, the others dashed with markers, so identical
    curves show as two. Log y axis only over more than a decade (the label then says so).
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = list(histories)
    for i, (name, style) in enumerate(zip(names, _line_styles(names, dtype), strict=True)):
        losses = [float(v) for v in histories[name]]
        ax.plot(range(1, len(losses) + 1), losses, label=name,
                **_sparse_markers(style, len(losses), i))
    log = use_log_scale([float(v) for h in histories.values() for v in h])
    ax.set(title=title, xlabel=xlabel, ylabel=_scale_label(ylabel, log),
           yscale="log" if log else "linear")
    if log:
        _label_log_axis(ax.yaxis, [float(v) for h in histories.values() for v in h])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _plain(value: float) -> str:
    """Three significant digits without an exponent where that reads better: 1340, 24.3, 0.0123
    (not 1.34e+03); a value far from 1 keeps its exponent (3.4e+38)."""
    if value == 0 or not 1e-3 <= abs(value) < 1e6:
        return f"{value:.3g}"
    return f"{float(f'{value:.3g}'):,.10g}"


def _label_log_axis(axis: object, values: Sequence[float]) -> None:
    """A log axis over a decade or two shows one power of ten at most: there, label 2 and 5 times
    each power too (0.02, 0.05, 0.1, 0.2), in plain numbers, so the reader can read values off
    it; over more decades the powers of ten alone."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    axis.set_major_formatter(lambda v, _: _plain(v))
    if finite.size and finite.max() / finite.min() <= 100:
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        axis.set_minor_formatter(lambda v, _: _plain(v))


def _scale_label(label: str, log: bool) -> str:
    """``label`` saying "log scale" exactly when the axis is: "loss (2-norm, log scale)"."""
    label = re.sub(r",\s*log scale", "", re.sub(r"\s*\(log scale\)", "", label))
    if not log:
        return label
    return f"{label[:-1]}, log scale)" if label.endswith(")") else f"{label} (log scale)"


def plot_bars(values: Mapping[str, Mapping[str, float]], title: str,
              errors: Mapping[str, Mapping[str, float]] | None = None,
              noise: Mapping[str, str | None] | None = None) -> Figure:
    """One panel per metric (e.g. 'time per step (ms)'), one bar per run in its dtype's colour
    (hatched where two runs share one), value printed on top; ``errors`` (same keys, a metric
    may be left out): a whisker of that half-length on each bar, e.g. half the interquartile
    range. ``noise``: metric -> why its bars give no ratio here (``measure.Comparison.noise``;
    None: they do): that panel's bars drawn pale, and "no ratio from these bars: <why>" in red
    under them.
    """
    metrics = list(values)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.3), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        runs = values[metric]
        colours = [colour_for(run) for run in runs]
        hatches = ["", "//", "..", "xx"]
        whiskers = ([errors[metric][run] for run in runs] if errors and metric in errors
                    else None)
        why = (noise or {}).get(metric)
        # a time is never below 0: a whisker longer than its bar stops at the axis
        yerr = ([[min(w, v) for w, v in zip(whiskers, runs.values(), strict=True)], whiskers]
                if whiskers else None)
        bars = ax.bar(range(len(runs)), list(runs.values()), color=colours, edgecolor="white",
                      hatch=[hatches[colours[:i].count(c) % 4] for i, c in enumerate(colours)],
                      yerr=yerr, capsize=3 if whiskers else 0, ecolor=MARKS["normal"],
                      alpha=0.45 if why else None)
        ax.set_xticks(range(len(runs)),
                      [textwrap.fill(run, 9, break_long_words=False) for run in runs])
        for x, (value, bar) in enumerate(zip(runs.values(), bars, strict=True)):
            top = bar.get_height() + (whiskers[x] if whiskers else 0.0)  # above its whisker
            ax.annotate(_plain(float(value)), (x, top), xytext=(0, 2), ha="center", va="bottom",
                        textcoords="offset points")
        ax.set(title=metric, ylabel=metric)
        if why:  # under the run names, where the eye goes after the bars
            ax.set_xlabel(textwrap.fill(f"no ratio from these bars: {why}", 48),
                          color=MARKS["lost"], fontsize=8)
        ax.margins(y=0.15)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _as_2d(image: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(image, torch.Tensor):
        image = image.detach().float().cpu().numpy()
    return np.asarray(image).reshape(image.shape[-2], image.shape[-1])


def _lowest_input_precision(input_dtypes: str) -> str:
    """The palette key of the narrowest float among an op's input dtypes ("bf16, fp32" -> bf16);
    fp32 when none is narrower."""
    for key in ("float8_e4m3fn", "float8_e5m2", "fp16", "bf16"):
        if any(palette_key(d) == key for d in input_dtypes.split(",")):
            return key
    return "fp32"


def _short_op(name: str, width: int = 30) -> str:
    """An op's name without its argument list, a long one on two lines at the ``_`` nearest the
    middle: "aten::_scaled_dot_product_flash" / "_attention_for_cpu_backward"."""
    name = name.split("(")[0].strip()
    cuts = [i for i, c in enumerate(name) if c == "_" and 0 < i]
    if len(name) <= width or not cuts:
        return name
    cut = min(cuts, key=lambda i: abs(i - len(name) / 2))
    return f"{name[:cut]}\n{name[cut:]}"


def plot_op_times(rows: Sequence[Mapping[str, object]], title: str, top: int = 15) -> Figure:
    """Self time of the ``top`` ops of a profiled step, one bar per (op, input dtypes) labelled
    with the op's short name, and its input dtypes where that name labels more than one bar (three
    ``aten::copy_`` bars read "aten::copy_ (bf16, fp32)", ...), coloured by its narrowest input
    dtype (rows from ``measure.op_dtype_rows``).
    """
    shown = list(rows)[:top][::-1]
    keys = [_lowest_input_precision(str(r["input dtypes"])) for r in shown]
    names = [_short_op(str(r["op"])) for r in shown]
    repeated = {n for n, count in Counter(names).items() if count > 1}
    labels = [f"{n} ({r['input dtypes']})" if n in repeated else n
              for n, r in zip(names, shown, strict=True)]
    fig, ax = plt.subplots(figsize=(9, 0.34 * len(shown) + 1.6))
    ax.barh(range(len(shown)), [float(r["self time (us)"]) / 1e3 for r in shown],
            color=[PALETTE[k] for k in keys])
    ax.set_yticks(range(len(shown)), labels)
    ax.set(title=textwrap.fill(title, 80), xlabel="self time in the step (ms)")
    present = [k for k in PALETTE if k in keys]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=PALETTE[k]) for k in present],
              labels=[f"{k} inputs" if k != "fp32" else "no 16- or 8-bit input" for k in present],
              title="narrowest input", fontsize=8, title_fontsize=8, loc="lower right")
    ax.tick_params(axis="y", labelsize=8)
    ax.margins(y=0.01)
    fig.tight_layout()
    return fig


def plot_gradient_magnitudes(grads: torch.Tensor, scale: float, title: str) -> Figure:
    """Histogram of log2 |gradient| (zeros left out), and the same times ``scale``, over float16's
    bands: flushed to 0, subnormal, normal, and the overflow line at its largest value.
    """
    fp16 = torch.finfo(torch.float16)
    subnormal, normal = fp16.smallest_normal * fp16.eps, fp16.smallest_normal
    flush, low, top = np.log2(subnormal / 2), np.log2(normal), np.log2(fp16.max)
    magnitudes = np.log2(grads[grads != 0].abs().float().cpu().numpy())
    shift = np.log2(scale)
    bins = np.arange(np.floor(min(magnitudes.min(), flush - 2)),
                     max(np.ceil(magnitudes.max()) + shift, np.ceil(top) + 2) + 1, 0.5)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.axvspan(bins[0], flush, color=MARKS["lost"], alpha=0.12, lw=0,
               label="flushed: rounds to 0 in fp16 (below 2^-25)")
    ax.axvspan(flush, low, color=MARKS["subnormal"], alpha=0.2, lw=0,
               label="fp16 subnormal (2^-25 to 2^-14, fewer bits)")
    ax.axvspan(low, top, color=MARKS["normal"], alpha=0.1, lw=0,
               label="fp16 normal (2^-14 to 65504, 11 bits)")
    ax.axvline(top, color=MARKS["lost"], lw=2, label="overflow: fp16 max 65504, inf above")
    ax.hist(magnitudes, bins=bins, alpha=0.75, color=PALETTE["fp32"],
            label="true gradients (fp32)")
    ax.hist(magnitudes + shift, bins=bins, alpha=0.75, color=PALETTE["fp16"],
            label=f"x 2^{shift:g} (what GradScaler feeds fp16)")
    ax.set_xlim(bins[0], bins[-1])
    ax.set(title=title, xlabel="gradient magnitude (log2; -24 is about 6e-8, 16 about 65536)",
           ylabel="number of gradient values")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def plot_scale_history(scales: Mapping[str, Sequence[float]] | Sequence[float], title: str,
                       skipped: Sequence[bool] | None = None,
                       marked_step: int | None = None) -> Figure:
    """A GradScaler's scale (log2) per run: ``scales`` is ``[scale at the start, get_scale()
    after step 0's update(), after step 1's, ...]``, drawn at x = start, 0, 1, ...

    Skipped steps (the update lowered the scale, or ``skipped`` for a single run) are marked;
    ``marked_step`` draws a vertical line at that step, e.g. where an inf was injected.
    """
    runs = dict(scales) if isinstance(scales, Mapping) else {"scale after update()": scales}
    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = list(runs)
    marked = False
    for name, style in zip(names, _line_styles(names, "fp16"), strict=True):
        values = np.log2(np.asarray(runs[name], dtype=float))
        steps = np.arange(-1, len(values) - 1)
        style = {k: v for k, v in style.items() if k not in ("marker", "ms", "mfc")}
        # the last scale held for half a step, so a skipped last step's dot sits on a level
        ax.plot([*steps, steps[-1] + 0.5], [*values, values[-1]], label=name,
                drawstyle="steps-post", **style)
        drops = (list(skipped) if skipped is not None and len(runs) == 1
                 else list(values[1:] < values[:-1]))
        hits = [s for s, skip in enumerate(drops) if skip]
        if hits:
            ax.scatter(hits, values[[s + 1 for s in hits]], color=MARKS["lost"], s=18, zorder=4,
                       label=None if marked else "skipped step (inf/NaN gradient): scale lowered")
            marked = True
    if marked_step is not None:
        ax.axvline(marked_step, color=MARKS["lost"], ls=":", label=f"inf injected (step "
                   f"{marked_step})")
    n = max(len(v) for v in runs.values()) - 1
    ticks = [t for t in MaxNLocator(nbins=10, integer=True).tick_values(0, n - 1)
             if n / 15 - 1 < t < n]  # none beside "start"
    ax.set_xticks([-1, *ticks], ["start", *(f"{t:g}" for t in ticks)])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=title, xlabel="training step (the scale its update() left)",
           ylabel="scale (log2)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig



GROUP_COLOURS: dict[str, str] = {  # amp_tutorial.step_profile.GROUPS: no dtype's colour
    group: MARKS[group] for group in ("matmul", "attention", "memory-bound", "optimizer", "idle")}


def plot_utilization(rows: Sequence[tuple[str, float, float | None]], measure: str,
                     title: str, goal: float | None = None,
                     missing: Sequence[tuple[str, str]] = (),
                     noisy: Mapping[str, str] | None = None) -> Figure:
    """One horizontal bar per rung (label, share, quartile spread as a share or None), in the
    colour of the dtype its label names, the share printed at its end; ``goal`` as a line.
    ``missing``: (rung, why) for each rung without a bar, listed under the axis by reason, so a
    reader sees which rungs are absent and why (with no bar at all, the axis says so).
    ``noisy``: rung label -> why its timing is noise (``measure.why_noisy``): its bar is drawn
    pale and the reason listed under the axis, as no result."""
    noisy = noisy or {}
    note = "\n".join(filter(None, [_missing_note(missing), _missing_note(
        list(noisy.items()), heading="Pale, timed while the machine was busy (no result):")]))
    note_lines = note.count("\n") + 1 if note else 0
    height = 0.45 * max(len(rows), 1) + 1.4 + 0.13 * note_lines
    fig, ax = plt.subplots(figsize=(7, height))
    labels = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    errors = [r[2] or 0.0 for r in rows][::-1]
    bars = ax.barh(range(len(rows)), values, xerr=errors, capsize=3, ecolor=MARKS["normal"],
                   color=[colour_for(label) for label in labels])
    for bar, label in zip(bars, labels, strict=True):
        if label in noisy:
            bar.set_alpha(0.45)
    ax.bar_label(bars, labels=[f"{v:.1%}" for v in values], padding=4, fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    if not rows:
        ax.text(0.5, 0.5, f"no rung has a {measure} here: why, below" if missing else
                f"no rung has a {measure}", transform=ax.transAxes, ha="center", va="center",
                fontsize=9, color=MARKS["normal"])
    if goal is not None:
        ax.axvline(goal, color=MARKS["lost"], linestyle="--", label=f"goal {goal:.0%}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set(title=title, xlabel=measure)
    # room for each whisker and the share printed past it (bar_label puts it beyond the whisker)
    ax.set_xlim(0, max([*(v + e for v, e in zip(values, errors, strict=True)), goal or 0]) * 1.3
                or 1)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    bottom = 0.0
    if note:
        bottom = (0.13 * note_lines + 0.08) / height
        fig.text(0.02, 0.02, note, fontsize=7.5, va="bottom", ha="left", wrap=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def _missing_note(missing: Sequence[tuple[str, str]], width: int = 110,
                  heading: str = "Not drawn:") -> str:
    """``heading`` and one wrapped line per reason, naming the rungs it applies to, in order."""
    by_reason: dict[str, list[str]] = {}
    for name, why in missing:
        by_reason.setdefault(why, []).append(name)
    if not by_reason:
        return ""
    lines = [heading]
    for why, names in by_reason.items():
        lines.append(textwrap.fill(f"{', '.join(names)}: {why}", width, initial_indent="- ",
                                   subsequent_indent="  ", break_long_words=False))
    return "\n".join(lines)


def plot_time_shares(shares: Mapping[str, Mapping[str, float]], title: str,
                     missing: Sequence[tuple[str, str]] = ()) -> Figure:
    """One stacked horizontal bar per rung: each group's share of the step, left to right.
    ``missing``: (rung, why) for each rung without a profile, listed under the legend by reason
    (as ``plot_utilization`` lists its missing rungs)."""
    note = _missing_note(missing)
    note_lines = note.count("\n") + 1 if note else 0
    height = 0.45 * len(shares) + 2.0 + 0.13 * note_lines
    fig, ax = plt.subplots(figsize=(7, height))
    names = list(shares)[::-1]
    left = np.zeros(len(names))
    for group, colour in GROUP_COLOURS.items():
        widths = np.array([shares[n].get(group, 0.0) for n in names])
        ax.barh(range(len(names)), widths, left=left, color=colour, label=group)
        for y, (x, w) in enumerate(zip(left, widths, strict=True)):
            if w >= 0.07:
                ax.text(x + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=7,
                        color="black" if group in ("memory-bound", "idle") else "white")
        left += widths
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set(title=title, xlabel="share of the step's time", xlim=(0, 1))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    below = (0.13 * note_lines + 0.08) / height if note else 0.0  # the note, under the legend
    if note:
        fig.text(0.02, 0.02, note, fontsize=7.5, va="bottom", ha="left")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, ncols=5, loc="lower center",
               bbox_to_anchor=(0.5, below))
    fig.tight_layout(rect=(0, below + 0.4 / height, 1, 1))  # legend below the axis label
    return fig


def plot_sweep(curves: Mapping[str, Mapping[int, tuple[float, float]]], title: str,
               measure: str) -> Figure:
    """Left: each curve's value (``measure``, e.g. MFU) over the model's width; right: AMP's
    speedup over fp32 at each width, for every AMP curve with an fp32 curve of the same tokens.
    ``curves``: label -> {width: (value, ms per step)}; labels "fp32, N tokens", "AMP bf16, ..."."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    token_counts = sorted({label.split(",", 1)[1] for label in curves},
                          key=lambda t: int(re.sub(r"\D", "", t) or 0))
    for label, points in curves.items():
        widths = sorted(points)
        n = token_counts.index(label.split(",", 1)[1])  # more tokens: another marker, paler
        look = {"color": colour_for(label), "marker": "osD^"[n % 4],
                "alpha": 1.0 - 0.35 * min(n, 1)}
        left.plot(widths, [points[w][0] for w in widths],
                  "-" if label.startswith("fp32") else "--", label=label, **look)
        if not label.startswith("fp32"):
            base = curves.get("fp32," + label.split(",", 1)[1])
            if base:
                shared = [w for w in widths if w in base]
                right.plot(shared, [base[w][1] / points[w][1] for w in shared],
                           label=label, **look)
    right.axhline(1.0, color=MARKS["normal"], linewidth=1)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({w for p in curves.values() for w in p}))
        ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0f}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a CPU has no AMP curve of the matmul rate
            ax.legend(fontsize=7)
    left.set(title=measure, xlabel="width (d_model)", ylabel=measure)
    left.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    right.set(title="AMP speedup over fp32 (t_fp32 / t_AMP)", xlabel="width (d_model)",
              ylabel="speedup")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# the ops of lesson 01's op x device map: one or two of each kind of rule
AUTOCAST_MAP_OPS = ("matmul (a @ b)", "conv2d", "add (a + b)", "exp", "softmax", "sum",
                    "layer_norm", "batch_norm", "cat", "addcmul", "mse_loss",
                    "binary_cross_entropy")


def _ink(colour: str) -> str:
    """Black or white, whichever reads better on ``colour``."""
    r, g, b = to_rgb(colour)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def plot_autocast_rules(rules: Mapping[str, Mapping[str, str]], low: torch.dtype,
                        ops: Sequence[str] = AUTOCAST_MAP_OPS, title: str | None = None) -> Figure:
    """Autocast's rule for each op (rows) on each device (columns), one cell each, in the colour of
    the dtype the op runs in: ``low``'s where autocast lowers it, fp32's where it keeps float32;
    promote, refused and no rule in their ``MARKS``. ``rules``: device -> op -> the rule
    ``autocast_policy`` found (a DataFrame with op rows and device columns works too).
    """
    from amp_tutorial import autocast_policy as rule_of
    from amp_tutorial.device import dtype_name

    if hasattr(rules, "to_dict"):  # a DataFrame: {column: {row: value}}
        rules = rules.to_dict()
    name = dtype_name(low)
    look = {  # rule -> (colour, the cell's words, the legend's words)
        rule_of.LOWERED: (colour_for(low), name, f"{name}: inputs cast down to {name}"),
        rule_of.FP32: (PALETTE["fp32"], "fp32", "fp32: inputs cast up to fp32"),
        rule_of.FP32_OUT: (PALETTE["fp32"], "fp32*", "fp32*: fp32 unless you pass dtype="),
        rule_of.PROMOTE: (MARKS["widest input"], "widest",
                          "widest: mixed inputs cast to the widest"),
        rule_of.BANNED: (MARKS["lost"], "refused", "refused: raises under autocast"),
        rule_of.NO_RULE: (MARKS["no rule"], "as given", "as given: on no list, no cast"),
        rule_of.HAS_RULE: (MARKS["normal"], "a rule", "a rule: registered, not probed"),
    }
    devices = list(rules)
    fig, ax = plt.subplots(figsize=(max(1.35 * len(devices) + 2.4, 7.0), 0.34 * len(ops) + 2.3))
    shown = []
    for col, device in enumerate(devices):
        for row, op in enumerate(ops):
            rule = rules[device][op]
            colour, words, _ = look[rule]
            ax.add_patch(plt.Rectangle((col, row), 1, 1, facecolor=colour, edgecolor="white",
                                       lw=2, hatch="//" if rule == rule_of.FP32_OUT else None))
            ax.text(col + 0.5, row + 0.5, words, ha="center", va="center", fontsize=8,
                    color=_ink(colour), bbox={"facecolor": colour, "lw": 0, "pad": 3})
            shown.append(rule)
    ax.set_xlim(0, len(devices))
    ax.set_ylim(len(ops), 0)
    ax.set_xticks([c + 0.5 for c in range(len(devices))], devices)
    ax.set_yticks([r + 0.5 for r in range(len(ops))], ops, fontsize=9)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    present = [rule for rule in look if rule in shown]
    hatched = {rule_of.FP32_OUT}
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, facecolor=look[r][0], edgecolor=MARKS["normal"],
                                     hatch="//" if r in hatched else None) for r in present],
              labels=[look[r][2] for r in present], fontsize=8, ncols=2,
              loc="upper center", bbox_to_anchor=(0.4, -0.02), frameon=False)
    ax.set_title(title or f"What autocast does to each op, by device ({name} as its dtype)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_resume(straight: Sequence[float], resumed: Mapping[str, Sequence[float]],
                resumed_at: int, dtype: str | torch.dtype | None = None,
                title: str = "Resuming from a checkpoint", ylabel: str = "loss") -> Figure:
    """Left: the loss per step of a run trained straight through, and of each run resumed from a
    checkpoint saved after step ``resumed_at`` (its steps ``resumed_at + 1`` on), dashed with
    markers over it. Right: each resumed loss minus the straight one, step by step, on a linear
    axis: an exact resume is a flat line at 0. ``dtype``: the runs' dtype, for their colour;
    ``ylabel``: what the loss is ("MSE loss"), on both panels' axes.
    """
    names = ["straight through", *resumed]
    styles = _line_styles(names, dtype)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4))
    straight = [float(v) for v in straight]
    left.plot(range(1, len(straight) + 1), straight, label=names[0], **styles[0])
    for i, (name, style) in enumerate(zip(names[1:], styles[1:], strict=True), start=1):
        losses = [float(v) for v in resumed[name]]
        steps = range(resumed_at + 1, resumed_at + len(losses) + 1)
        left.plot(steps, losses, label=name, **_sparse_markers(style, len(losses), i))
        diff = [a - b for a, b in zip(losses, straight[resumed_at:], strict=False)]
        worst = max((abs(d) for d in diff), default=0.0)
        right.plot(steps[:len(diff)], diff, **_sparse_markers(style, len(diff), i),
                   label=f"{name}: largest |difference| {worst:.2g}")
    for ax in (left, right):
        ax.axvline(resumed_at + 0.5, color=MARKS["normal"], ls=":", lw=1.5,
                   label=f"checkpoint saved after step {resumed_at}" if ax is left else None)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    right.axhline(0.0, color=MARKS["normal"], lw=1)
    right.set_xlim(resumed_at, left.get_xlim()[1])
    log = use_log_scale(straight)
    left.set(title="loss per step", xlabel="training step", ylabel=_scale_label(ylabel, log),
             yscale="log" if log else "linear")
    if log:
        _label_log_axis(left.yaxis, straight)
    right.set(title="resumed minus straight through", xlabel="training step",
              ylabel=f"{ylabel} difference")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_block_dtypes(ops: Sequence[object], title: str) -> Figure:
    """The ops of one forward pass in order, top to bottom, one box each in the colour of the
    dtype it gave, named by the module that ran it (``OpTrace.where``, from ``trace_module``);
    the casts autocast inserted before an op are folded into it and counted on its right.
    """
    rows, casts = [], []
    for t in ops:
        if t.op == "_to_copy":
            casts.append(t)
            continue
        rows.append((t, casts))
        casts = []
    rows += [(t, []) for t in casts]  # casts with no op after them
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.7))
    shown = []
    for y, (t, before) in enumerate(rows):
        key = palette_key(t.output)
        shown.append(key)
        ax.add_patch(plt.Rectangle((0, y + 0.15), 0.48, 0.7, facecolor=PALETTE[key],
                                   edgecolor="white"))
        name = f"{t.where}: {t.op}" if t.where else f"{t.op} (in the module's own forward)"
        ax.text(0.01, y + 0.5, name, va="center", fontsize=8, color=_ink(PALETTE[key]))
        note = f"in {', '.join(t.inputs)} -> out {t.output}"
        if before:
            pairs = Counter(f"{c.inputs[0]} -> {c.output}" for c in before)
            note += "   (autocast cast " + ", ".join(
                f"{k} input{'s' if k > 1 else ''} {p}" for p, k in pairs.items()) + " first)"
        ax.text(0.5, y + 0.5, note, va="center", fontsize=8)
        if y:
            ax.annotate("", xy=(0.24, y + 0.15), xytext=(0.24, y - 0.15),
                        arrowprops={"arrowstyle": "->", "color": MARKS["normal"]})
    ax.set(xlim=(0, 1), ylim=(len(rows), 0), xticks=[], yticks=[])
    ax.set_ylabel("forward pass, in order (top first)")
    for spine in ax.spines.values():
        spine.set_visible(False)
    present = [k for k in PALETTE if k in shown]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=PALETTE[k]) for k in present],
              labels=[f"output in {k}" for k in present], fontsize=8, loc="lower right",
              bbox_to_anchor=(1.0, 1.0), ncols=len(present), frameon=False)
    ax.set_title(textwrap.fill(title, 90), loc="left", fontsize=10, pad=14)
    fig.tight_layout()
    return fig


def plot_broken_and_fixed(broken: Mapping[str, Sequence[float]],
                          fixed: Mapping[str, Sequence[float]], title: str,
                          broken_note: str = "", fixed_note: str = "", ylabel: str = "loss",
                          dtype: str | torch.dtype | None = None) -> Figure:
    """Two panels on one y axis: left the losses per step of the broken runs (fp32 and the AMP
    run that failed), right the same runs once fixed, each run in its dtype's colour (fp32 solid,
    the others dashed with markers over it). A step whose loss is inf or NaN cannot be drawn as
    a point: it gets a red x along the panel's top, and its run's label counts them.
    ``broken_note``/``fixed_note``: what was wrong and what changed, after "broken: "/"fixed: ".
    """
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.0), sharey=True)
    finite = [float(v) for h in (*broken.values(), *fixed.values()) for v in h
              if math.isfinite(float(v))]
    log = use_log_scale(finite)
    for ax, runs, what, note in ((axes[0], broken, "broken", broken_note),
                                 (axes[1], fixed, "fixed", fixed_note)):
        names = list(runs)
        marked = False
        for i, (name, style) in enumerate(zip(names, _line_styles(names, dtype), strict=True)):
            losses = [float(v) for v in runs[name]]
            steps = list(range(1, len(losses) + 1))
            lost = [s for s, v in zip(steps, losses, strict=True) if not math.isfinite(v)]
            label = name if not lost else f"{name}: inf/NaN at {len(lost)} of {len(losses)} steps"
            ax.plot(steps, losses, label=label, **_sparse_markers(style, len(losses), i))
            if lost:
                ax.scatter(lost, [0.93] * len(lost), transform=ax.get_xaxis_transform(),
                           marker="x", s=40, color=MARKS["lost"], zorder=4, clip_on=False,
                           label=None if marked else "inf/NaN loss (no point to draw)")
                marked = True
        ax.set(title=f"{what}: {note}" if note else what, xlabel="training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    axes[0].set(ylabel=_scale_label(ylabel, log), yscale="log" if log else "linear")
    if log:
        _label_log_axis(axes[0].yaxis, finite)
    if finite:  # room at the top for the x's of the steps that have no loss to draw
        low, high = min(finite), max(finite)
        pad = (high - low) * 0.1 or abs(high) * 0.1 or 1.0
        axes[0].set_ylim(low / 1.5 if log else low - pad, high * 3 if log else high + 2.5 * pad)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
