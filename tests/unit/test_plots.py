"""Every shared figure has a title and labelled axes, shows what it is given, and takes its
colours from the one palette (a dtype keeps its colour in every figure)."""

import inspect

import matplotlib

matplotlib.use("agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from amp_tutorial import plots  # noqa: E402
from amp_tutorial.autocast_policy import (  # noqa: E402
    BANNED,
    FP32,
    FP32_OUT,
    HAS_RULE,
    LOWERED,
    NO_RULE,
    PROMOTE,
    OpTrace,
    autocast_policy,
    trace_module,
)
from amp_tutorial.plots import MARKS, PALETTE, colour_for, palette_key, use_log_scale  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _labels(fig):
    return [(ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes
            if ax.get_label() != "<colorbar>"]


# --- the palette -------------------------------------------------------------------------------

@pytest.mark.parametrize(("run", "key"), [
    ("fp32", "fp32"), ("fp32 (TF32 convolutions)", "fp32"), ("fp32 (strict, TF32 off)", "fp32"),
    ("TF32", "tf32"), ("AMP bf16", "bf16"), ("AMP fp16", "fp16"), ("eager bf16", "bf16"),
    ("your AMP loop (bfloat16)", "bf16"), ("your AMP loop (float16)", "fp16"),
    ("compiled AMP bf16", "compiled"), ("compiled fp32", "compiled"),
    ("AMP bf16 (fp32 weights)", "bf16"), ("pure bf16 (bf16 weights)", "bf16"),
    ("c10::Float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
    ("FP8 training", "float8_e4m3fn"), ("unscale_ then clip", "other"),
    (torch.float32, "fp32"), (torch.float16, "fp16"), (torch.bfloat16, "bf16"),
    (torch.float8_e4m3fn, "float8_e4m3fn"), (torch.float8_e5m2, "float8_e5m2"),
])
def test_a_label_or_dtype_maps_to_its_palette_entry(run, key):
    assert palette_key(run) == key
    assert colour_for(run) == PALETTE[key]


def test_a_label_that_names_no_dtype_takes_the_default():
    assert colour_for("healthy run", default="fp16") == PALETTE["fp16"]
    assert colour_for("healthy run", default=torch.bfloat16) == PALETTE["bf16"]
    assert colour_for("AMP bf16", default="fp16") == PALETTE["bf16"]  # the label wins


def test_every_palette_entry_and_mark_has_its_own_colour():
    runs = [to_rgb(c) for c in PALETTE.values()]
    assert len(set(runs)) == len(runs)
    assert not {to_rgb(MARKS["lost"]), to_rgb(MARKS["subnormal"])} & set(runs)


# --- every helper draws in palette colours -----------------------------------------------------

ROWS = [{"op": "aten::addmm", "input dtypes": "bf16, bf16, bf16", "self time (us)": 3000.0},
        {"op": "aten::native_layer_norm_backward", "input dtypes": "fp32, fp32, fp32, fp32, fp32",
         "self time (us)": 2000.0},
        {"op": "aten::_scaled_mm", "input dtypes": "c10::Float8_e4m3fn, c10::Float8_e4m3fn",
         "self time (us)": 1000.0},
        {"op": "aten::mm", "input dtypes": "fp16, fp32", "self time (us)": 500.0}]
IMAGE = torch.rand(1, 1, 8, 8)
RULES = {"cpu": {"mm": LOWERED, "exp": NO_RULE, "cat": PROMOTE, "loss": FP32},
         "cuda": {"mm": LOWERED, "exp": FP32, "cat": NO_RULE, "loss": BANNED},
         "mps": {"mm": LOWERED, "exp": FP32_OUT, "cat": HAS_RULE, "loss": NO_RULE}}
BLOCK = [OpTrace("native_layer_norm", ("fp32",), "fp32", "ln"),
         OpTrace("_to_copy", ("fp32",), "bf16", "fc"), OpTrace("_to_copy", ("fp32",), "bf16", "fc"),
         OpTrace("addmm", ("bf16", "bf16"), "bf16", "fc"),
         OpTrace("add", ("fp32", "bf16"), "fp32", "")]
SAMPLES = {  # small inputs for each public plotting helper
    "plot_dtype_ranges": lambda: plots.plot_dtype_ranges(
        (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)),
    "plot_image": lambda: plots.plot_image(IMAGE, "target"),
    "plot_outputs": lambda: plots.plot_outputs(
        {"target": IMAGE, "fp32": IMAGE, "AMP bf16": IMAGE}, "outputs"),
    "plot_losses": lambda: plots.plot_losses(
        {"fp32": [1.0, 0.5, 0.2], "AMP bf16": [1.0, 0.5, 0.2], "AMP fp16": [1.0, 0.6, 0.3]}),
    "plot_bars": lambda: plots.plot_bars(
        {"time (ms)": {"eager fp32": 2.0, "eager bf16": 1.0, "compiled fp32": 1.5,
                       "compiled bf16": 0.8}}, "bars",
        errors={"time (ms)": {"eager fp32": 0.1, "eager bf16": 0.1, "compiled fp32": 0.2,
                              "compiled bf16": 0.1}}),
    "plot_op_times": lambda: plots.plot_op_times(ROWS, "ops"),
    "plot_gradient_magnitudes": lambda: plots.plot_gradient_magnitudes(
        torch.tensor([2.0**-30, 2.0**-20, 0.0, -(2.0**-10)]), 2.0**16, "gradients"),
    "plot_scale_history": lambda: plots.plot_scale_history(
        {"healthy": [8.0, 8.0, 16.0], "collapsing": [8.0, 4.0, 2.0]}, "scale"),
    "plot_utilization": lambda: plots.plot_utilization(
        [("fp32", 0.6, 0.01), ("AMP bf16 + compile", 0.2, None)], "MFU", "ladder", 0.4),
    "plot_time_shares": lambda: plots.plot_time_shares(
        {"fp32": {"matmul": 0.7, "attention": 0.1, "memory-bound": 0.1, "optimizer": 0.05,
                  "idle": 0.05}}, "shares"),
    "plot_autocast_rules": lambda: plots.plot_autocast_rules(
        RULES, torch.bfloat16, ops=["mm", "exp", "cat", "loss"]),
    "plot_resume": lambda: plots.plot_resume(
        [1.0, 0.8, 0.7, 0.6], {"resumed": [0.7, 0.6], "resumed, other data": [0.75, 0.6]}, 2,
        dtype=torch.float16),
    "plot_block_dtypes": lambda: plots.plot_block_dtypes(BLOCK, "one block"),
    "plot_broken_and_fixed": lambda: plots.plot_broken_and_fixed(
        {"fp32": [0.5, 0.4, 0.35], "AMP fp16": [float("nan"), float("inf"), 0.36]},
        {"fp32": [0.5, 0.4, 0.35], "AMP fp16": [0.5, 0.4, 0.35]}, "hazard"),
    "plot_sweep": lambda: plots.plot_sweep(
        {"fp32, 512 tokens": {64: (0.5, 0.02), 128: (0.6, 0.05)},
         "AMP bf16, 512 tokens": {64: (0.1, 0.03), 128: (0.3, 0.02)}}, "sweep", "MFU"),
}
ALLOWED = {to_rgb(c) for c in [*PALETTE.values(), *MARKS.values()]}


def drawn_colours(fig) -> set[tuple[float, float, float]]:
    """The RGB of every line, marker, bar, shaded band and scatter point in ``fig``'s axes, and of
    any title drawn in colour (legends and images are not counted)."""
    found = set()
    for ax in [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]:  # a colour map's scale
        for line in ax.get_lines():
            found.add(to_rgb(line.get_color()))
            if line.get_marker() not in ("None", "", None) and line.get_markerfacecolor() != "none":
                found.add(to_rgb(line.get_markerfacecolor()))
        for patch in ax.patches:
            if patch.get_visible() and patch.get_fill() and patch.get_facecolor()[3] > 0:
                found.add(to_rgb(patch.get_facecolor()))
        for collection in ax.collections:
            found |= {tuple(c[:3]) for c in collection.get_facecolors() if c[3] > 0}
            if not len(collection.get_facecolors()):
                found |= {tuple(c[:3]) for c in collection.get_edgecolors()}
        if to_rgb(ax.title.get_color()) != (0.0, 0.0, 0.0):
            found.add(to_rgb(ax.title.get_color()))
    return found


def test_every_public_plotting_helper_has_a_sample_here():
    helpers = {name for name, fn in inspect.getmembers(plots, inspect.isfunction)
               if name.startswith("plot_") and fn.__module__ == plots.__name__}
    assert helpers == set(SAMPLES), "draw the new helper in SAMPLES, so its colours are checked"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_helper_takes_its_colours_from_the_palette(name):
    colours = drawn_colours(SAMPLES[name]())
    if name != "plot_image":  # the one figure that is only an image with a colour bar
        assert colours, f"{name} drew nothing in colour"
    assert colours <= ALLOWED, f"{name} drew colours outside the palette: {colours - ALLOWED}"


def test_the_colour_check_catches_a_colour_outside_the_palette():
    fig, ax = plt.subplots()
    ax.plot([1, 2], color=PALETTE["fp32"])
    ax.bar([0], [1], color="tab:olive")  # close to, but not, the subnormal mark
    assert drawn_colours(fig) - ALLOWED == {to_rgb("tab:olive")} - ALLOWED
    ax.plot([1, 2], color="magenta")
    assert to_rgb("magenta") in drawn_colours(fig) - ALLOWED


def test_one_dtype_has_one_colour_in_lines_bars_and_histograms():
    losses = plots.plot_losses({"fp32": [1.0, 0.5], "AMP bf16": [1.0, 0.4]}).axes[0]
    bars = plots.plot_bars({"t": {"fp32": 2.0, "AMP bf16": 1.0}}, "b").axes[0]
    grads = plots.plot_gradient_magnitudes(torch.tensor([2.0**-20]), 2.0**4, "g").axes[0]
    fp32, bf16 = to_rgb(PALETTE["fp32"]), to_rgb(PALETTE["bf16"])
    assert [to_rgb(line.get_color()) for line in losses.get_lines()] == [fp32, bf16]
    assert [to_rgb(p.get_facecolor()) for p in bars.patches] == [fp32, bf16]
    true_bars, scaled_bars = grads.containers
    assert to_rgb(true_bars[0].get_facecolor()) == fp32
    assert to_rgb(scaled_bars[0].get_facecolor()) == to_rgb(PALETTE["fp16"])


# --- what each figure shows --------------------------------------------------------------------

def test_dtype_ranges_has_one_row_per_dtype():
    fig = plots.plot_dtype_ranges()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fp32", "fp16", "bf16"]
    assert ax.get_title() and "log2" in ax.get_xlabel()
    normal = [to_rgb(line.get_color()) for line in ax.get_lines()][1::2]  # subnormal, normal
    assert normal == [to_rgb(colour_for(d)) for d in (torch.float32, torch.float16, torch.bfloat16)]


def test_image_and_outputs():
    fig = plots.plot_image(IMAGE, "target")
    assert fig._suptitle.get_text() == "target"
    assert _labels(fig)[0][1:] == ("x (normalised)", "y (normalised)")
    fig = plots.plot_outputs({"target": IMAGE, "fp32": IMAGE[0, 0]}, "side by side")
    assert [ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>"] == [
        "target", "fp32"]
    (bar,) = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]  # one scale, read off
    assert bar.get_ylim() == (0.0, 1.0) and "0 to 1" in bar.get_ylabel()
    assert fig._suptitle.get_text() == "side by side"
    assert to_rgb(fig.axes[1].title.get_color()) == to_rgb(PALETTE["fp32"])


def test_losses_one_line_per_run_the_reference_solid_the_others_dashed_with_markers():
    fig = plots.plot_losses({"AMP bf16": [1.0, 0.4], "fp32": [1.0, 0.5], "AMP fp16": [1.0, 0.5]})
    ax = fig.axes[0]
    amp, fp32, fp16 = ax.get_lines()
    assert [line.get_label() for line in (amp, fp32, fp16)] == ["AMP bf16", "fp32", "AMP fp16"]
    assert fp32.get_linestyle() == "-" and fp32.get_marker() in ("None", "")  # the reference
    for line in (amp, fp16):  # drawn over it, dashed and marked: visible where they coincide
        assert line.get_linestyle() != "-" and line.get_marker() not in ("None", "")
        assert line.get_zorder() > fp32.get_zorder()
    assert amp.get_linestyle() != fp16.get_linestyle() and amp.get_marker() != fp16.get_marker()


def test_losses_without_an_fp32_run_take_the_first_as_reference_and_the_given_dtype():
    fig = plots.plot_losses({"unscale_ then clip": [1.0, 0.5], "clip then unscale_": [1.0, 0.5]},
                            dtype="fp16")
    first, second = fig.axes[0].get_lines()
    assert first.get_linestyle() == "-" and second.get_linestyle() != "-"
    assert to_rgb(first.get_color()) == to_rgb(second.get_color()) == to_rgb(PALETTE["fp16"])


def test_markers_are_sparse_and_staggered_between_runs():
    n = 80
    fig = plots.plot_losses({"fp32": [1.0] * n, "AMP bf16": [1.0] * n, "AMP fp16": [1.0] * n})
    _, bf16, fp16 = fig.axes[0].get_lines()
    start_a, every_a = bf16.get_markevery()
    start_b, every_b = fp16.get_markevery()
    assert every_a == every_b == n // 8 and start_a != start_b


@pytest.mark.parametrize(("values", "log"), [
    ([1.0, 0.5], False), ([1.0, 0.8, 0.85], False), ([1.0, 0.1], False),  # a decade is not more
    ([1.0, 0.099], True), ([3e-4, 2.0, 1e-2], True),
    ([1.0, 0.0001, 0.0], False),  # a zero cannot go on a log axis
    ([1.0, float("nan"), 0.5, float("inf")], False), ([], False),
])
def test_log_axis_only_over_more_than_a_decade(values, log):
    assert use_log_scale(values) is log


def test_losses_axis_is_linear_under_a_decade_and_log_above_and_its_label_says_which():
    narrow = plots.plot_losses({"fp32": [0.06, 0.055, 0.053]}, ylabel="MSE loss (log scale)")
    ax = narrow.axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylabel() == "MSE loss"
    wide = plots.plot_losses({"fp32": [1.0, 0.01]}, ylabel="weight update norm (2-norm)")
    ax = wide.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "weight update norm (2-norm, log scale)"
    assert plots.plot_losses({"fp32": [1.0, 0.01]}).axes[0].get_ylabel() == "MSE loss (log scale)"


def test_a_log_axis_over_a_decade_or_two_labels_more_than_one_power_of_ten():
    ax = plots.plot_losses({"fp32": [0.6, 0.1, 0.03], "AMP bf16": [0.6, 0.1, 0.03]}).axes[0]
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    shown = [t.get_text() for t in [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)]
             if t.get_text() and low <= t.get_position()[1] <= high]
    assert {"0.05", "0.1", "0.2", "0.5"} <= set(shown), shown  # plain numbers, not 10^-1 alone
    ax = plots.plot_losses({"fp32": [1.0, 1e-6]}).axes[0]  # six decades: powers of ten only
    ax.figure.canvas.draw()
    assert not [t for t in ax.get_yticklabels(minor=True) if t.get_text()]


@pytest.mark.parametrize("n", [2, 3, 7, 40])
def test_step_axes_have_integer_ticks(n):
    ax = plots.plot_losses({"fp32": list(np.linspace(1.0, 0.9, n))}, xlabel="epoch").axes[0]
    ax.figure.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    ax = plots.plot_scale_history([8.0] * (n + 1), "scale").axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_bars_one_panel_per_metric_coloured_by_dtype_hatched_where_colours_repeat():
    fig = plots.plot_bars({"time (ms)": {"fp32": 2.0, "bf16": 1.0},
                           "memory (MB)": {"fp32": 4.0, "bf16": 2.0}}, "comparison")
    assert [ax.get_title() for ax in fig.axes] == ["time (ms)", "memory (MB)"]
    assert [p.get_height() for p in fig.axes[0].patches] == [2.0, 1.0]
    compiled = SAMPLES["plot_bars"]().axes[0].patches
    assert [to_rgb(p.get_facecolor()) for p in compiled] == [
        to_rgb(PALETTE[k]) for k in ("fp32", "bf16", "compiled", "compiled")]
    assert compiled[2].get_hatch() != compiled[3].get_hatch()  # two compiled runs told apart
    slow = plots.plot_bars({"time (ms)": {"fp32": 230.4, "AMP bf16": 1337.2}}, "b").axes[0]
    assert [t.get_text() for t in slow.texts] == ["230", "1,340"]  # not 1.34e+03
    timed = SAMPLES["plot_bars"]().axes[0]  # eager fp32 2.0 with a whisker of 0.1
    assert timed.texts[0].get_text() == "2" and timed.texts[0].xy[1] == pytest.approx(2.1)


def test_bars_whisker_only_the_metrics_given_and_mark_the_noisy_panel():
    why = "fp32's spread is 50% of its median, more than 25%: the machine was busy"
    fig = plots.plot_bars({"time (ms)": {"fp32": 2.0, "AMP bf16": 1.0},
                           "memory (MB)": {"fp32": 4.0, "AMP bf16": 2.0}}, "comparison",
                          errors={"time (ms)": {"fp32": 0.5, "AMP bf16": 0.25}},
                          noise={"time (ms)": why, "memory (MB)": None})
    time, memory = fig.axes
    assert [t.xy[1] for t in time.texts] == pytest.approx([2.5, 1.25])  # above the whiskers
    assert [t.xy[1] for t in memory.texts] == pytest.approx([4.0, 2.0])  # no whiskers there
    whiskered = [any(type(c).__name__ == "ErrorbarContainer" for c in ax.containers)
                 for ax in (time, memory)]
    assert whiskered == [True, False]
    note = time.get_xlabel().replace("\n", " ")
    assert note == f"no ratio from these bars: {why}"
    assert to_rgb(time.xaxis.label.get_color()) == to_rgb(MARKS["lost"])
    assert all(p.get_alpha() < 1 for p in time.patches)  # pale: not a result
    assert memory.get_xlabel() == "" and all(p.get_alpha() is None for p in memory.patches)
    quiet = plots.plot_bars({"time (ms)": {"fp32": 2.0}}, "b", noise={"time (ms)": None})
    assert quiet.axes[0].get_xlabel() == ""
    # a spread wider than twice the median: the whisker stops at 0, the upper one goes on
    wide = plots.plot_bars({"time (ms)": {"fp32": 2.0}}, "b", errors={"time (ms)": {"fp32": 3.0}})
    (bar,) = [c for c in wide.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    (segment,) = bar.lines[2][0].get_segments()
    assert [y for _, y in segment] == pytest.approx([0.0, 5.0])


def test_op_times_short_names_coloured_by_the_narrowest_input_and_bars_use_the_width():
    fig = plots.plot_op_times(ROWS, "Ops of one step")
    ax = fig.axes[0]
    assert ax.get_title() == "Ops of one step" and "ms" in ax.get_xlabel()
    fig.canvas.draw()
    labels = [t.get_text().replace("\n", "") for t in ax.get_yticklabels()]
    assert labels == [r["op"] for r in ROWS][::-1]  # the longest on top, no argument list
    assert all(len(line) <= 30 for t in ax.get_yticklabels() for line in t.get_text().split("\n"))
    assert sorted(p.get_width() for p in ax.patches) == [0.5, 1.0, 2.0, 3.0]
    colours = [to_rgb(p.get_facecolor()) for p in ax.patches][::-1]
    assert colours == [to_rgb(PALETTE[k]) for k in ("bf16", "fp32", "float8_e4m3fn", "fp16")]
    assert ax.get_position().width > 0.6  # the bars, not the labels, fill the figure
    signature = [{"op": "aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1)",
                  "input dtypes": "fp32", "self time (us)": 1.0}]
    (label,) = plots.plot_op_times(signature, "one").axes[0].get_yticklabels()
    assert label.get_text() == "aten::addmm"


def test_op_times_tell_bars_of_one_op_apart_by_their_input_dtypes():
    """Three ``aten::copy_`` bars (lesson 17's casts) read as one op three times over unless each
    says what it copied; an op that labels one bar keeps its short name."""
    rows = [{"op": "aten::copy_", "input dtypes": dtypes, "self time (us)": t}
            for dtypes, t in (("bf16, fp32", 3000.0), ("fp32, bf16", 2000.0),
                              ("fp32, fp32", 900.0))]
    rows.append({"op": "aten::mm", "input dtypes": "bf16, bf16", "self time (us)": 500.0})
    ax = plots.plot_op_times(rows, "casts").axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()][::-1]
    assert labels == ["aten::copy_ (bf16, fp32)", "aten::copy_ (fp32, bf16)",
                      "aten::copy_ (fp32, fp32)", "aten::mm"]


def test_gradient_magnitudes_shifts_by_the_scale_over_fp16s_bands():
    grads = torch.tensor([2.0**-30, 2.0**-20, 0.0, -(2.0**-10)])
    fig = plots.plot_gradient_magnitudes(grads, 2.0**16, "gradients")
    ax = fig.axes[0]
    assert ax.get_title() == "gradients" and "log2" in ax.get_xlabel() and ax.get_ylabel()
    true_bars, scaled_bars = ax.containers  # one histogram each; the zero is left out
    assert sum(b.get_height() for b in true_bars) == 3 == sum(b.get_height() for b in scaled_bars)
    lowest = min(b.get_x() for b in true_bars if b.get_height())
    assert lowest == -30 and min(b.get_x() for b in scaled_bars if b.get_height()) == -14
    bands = {to_rgb(p.get_facecolor()): (p.get_x(), p.get_x() + p.get_width())
             for p in ax.patches if p not in [*true_bars, *scaled_bars]}
    assert bands[to_rgb(MARKS["lost"])][1] == -25  # flushed: below half the smallest subnormal
    assert bands[to_rgb(MARKS["subnormal"])] == (-25, -14)
    top = np.log2(torch.finfo(torch.float16).max)
    assert bands[to_rgb(MARKS["normal"])] == pytest.approx((-14, top))
    (overflow,) = [line for line in ax.get_lines() if "overflow" in line.get_label()]
    assert overflow.get_xdata()[0] == pytest.approx(top) and ax.get_xlim()[1] > top
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("0 in fp16" in t for t in legend) and any("subnormal" in t for t in legend)
    assert any("normal (" in t for t in legend) and any("65504" in t for t in legend)


def test_scale_history_plots_each_runs_scale_after_every_update_over_the_same_steps():
    healthy, collapsing = [65536.0, 32768.0, 32768.0, 32768.0], [65536.0, 32768.0, 16384.0, 8192.0]
    fig = plots.plot_scale_history({"healthy": healthy, "collapsing": collapsing}, "scale")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["healthy"].get_xdata()) == list(lines["collapsing"].get_xdata()) == [
        -1, 0, 1, 2, 2.5]  # the start, then after step 0, 1, 2; the last level half a step
    assert list(lines["healthy"].get_ydata()) == [16, 15, 15, 15, 15]  # not shifted, not halved
    assert list(lines["collapsing"].get_ydata()) == [16, 15, 14, 13, 13]
    assert ax.get_xticklabels()[0].get_text() == "start" and ax.get_ylabel() == "scale (log2)"
    skipped = np.concatenate([c.get_offsets() for c in ax.collections]).tolist()
    assert sorted(skipped) == [[0, 15], [0, 15], [1, 14], [2, 13]]  # wherever a scale dropped
    # the last skipped step's dot starts a drawn level, not the bare end of the line
    (x_last, y_last) = lines["collapsing"].get_xydata()[-1]
    assert x_last > 2 and y_last == 13


def test_scale_history_of_one_run_marks_the_given_skips_and_step():
    fig = plots.plot_scale_history([8.0, 8.0, 4.0, 4.0], "scale", skipped=[False, True, False],
                                   marked_step=1)
    ax = fig.axes[0]
    assert ax.get_title() == "scale" and ax.get_ylabel() == "scale (log2)"
    (marked,) = ax.collections
    assert marked.get_offsets().tolist() == [[1.0, 2.0]]  # step 1 left the scale at 4 = 2^2
    assert any(line.get_label().startswith("inf injected") and line.get_xdata()[0] == 1
               for line in ax.get_lines())


def test_dtype_ranges_draw_each_formats_finfo_limits_fp8_included():
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
    ax = plots.plot_dtype_ranges(dtypes).axes[0]
    lines = ax.get_lines()
    for row, dtype in enumerate(dtypes):
        fi = torch.finfo(dtype)
        subnormal, normal = lines[2 * row], lines[2 * row + 1]
        assert list(subnormal.get_xdata()) == pytest.approx(
            np.log2([fi.smallest_normal * fi.eps, fi.smallest_normal]))
        assert list(normal.get_xdata()) == pytest.approx(np.log2([fi.smallest_normal, fi.max]))
        assert to_rgb(normal.get_color()) == to_rgb(colour_for(dtype))
    assert np.log2(448) == pytest.approx(lines[7].get_xdata()[1])  # e4m3fn stops at 448
    labels = [t.get_text() for t in ax.texts]
    assert "max 448, eps 2^-3" in labels and "max 57,344, eps 2^-2" in labels
    assert "2^-9" in labels and "2^-16" in labels  # e4m3fn's and e5m2's smallest subnormals
    lo, hi = ax.get_xlim()
    assert lo < np.log2(torch.finfo(torch.float32).smallest_normal * 2.0**-23) and hi > 128


def _cells(ax) -> dict[tuple[int, int], tuple]:
    """(column, row) -> RGB of each cell of the op x device map."""
    return {(round(p.get_x()), round(p.get_y())): to_rgb(p.get_facecolor()) for p in ax.patches}


def test_autocast_rules_colour_each_cell_by_the_rule_it_was_given():
    ax = SAMPLES["plot_autocast_rules"]().axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cpu", "cuda", "mps"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mm", "exp", "cat", "loss"]
    colour = {LOWERED: PALETTE["bf16"], FP32: PALETTE["fp32"], FP32_OUT: PALETTE["fp32"],
              PROMOTE: MARKS["widest input"], BANNED: MARKS["lost"], NO_RULE: MARKS["no rule"],
              HAS_RULE: MARKS["normal"]}
    cells = _cells(ax)
    for col, device in enumerate(RULES):
        for row, op in enumerate(["mm", "exp", "cat", "loss"]):
            assert cells[(col, row)] == to_rgb(colour[RULES[device][op]]), (device, op)
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert [(round(p.get_x()), round(p.get_y())) for p in hatched] == [(2, 1)]  # fp32 unless dtype=
    words = {t.get_text() for t in ax.texts}
    assert {"bf16", "fp32", "fp32*", "widest", "refused", "as given"} <= words
    fp16 = plots.plot_autocast_rules(RULES, torch.float16, ops=["mm"]).axes[0]
    assert set(_cells(fp16).values()) == {to_rgb(PALETTE["fp16"])}  # lowered: the dtype given


def test_autocast_rules_of_the_probe_colour_matmul_low_and_exp_by_device():
    rules = {d: {r.op: r.verdict for r in autocast_policy(d, torch.bfloat16)}
             for d in ("cpu", "cuda")}
    ax = plots.plot_autocast_rules(rules, torch.bfloat16).axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    cells = _cells(ax)
    mm, add, exp = (rows.index(op) for op in ("matmul (a @ b)", "add (a + b)", "exp"))
    assert cells[(0, mm)] == cells[(1, mm)] == to_rgb(PALETTE["bf16"])
    assert cells[(0, add)] == cells[(1, add)] == to_rgb(MARKS["no rule"])  # type promotion only
    assert (cells[(0, exp)], cells[(1, exp)]) == (to_rgb(MARKS["no rule"]), to_rgb(PALETTE["fp32"]))


def test_resume_overlaps_the_straight_run_visibly_and_plots_the_difference():
    straight = [1.0, 0.8, 0.7, 0.6, 0.5]
    fig = plots.plot_resume(straight, {"resumed": straight[2:], "wrong data": [0.7, 0.65, 0.5]}, 2)
    left, right = fig.axes
    reference, resumed, wrong, checkpoint = left.get_lines()
    assert list(resumed.get_xdata()) == [3, 4, 5] and list(resumed.get_ydata()) == straight[2:]
    assert resumed.get_linestyle() != "-" and resumed.get_marker() not in ("None", "")
    assert resumed.get_zorder() > reference.get_zorder() and reference.get_linestyle() == "-"
    assert checkpoint.get_xdata()[0] == 2.5 and "after step 2" in checkpoint.get_label()
    same, differs = right.get_lines()[:2]
    assert list(same.get_ydata()) == [0.0, 0.0, 0.0]
    assert list(differs.get_ydata()) == pytest.approx([0.0, 0.05, 0.0])
    assert same.get_label().endswith("largest |difference| 0")
    assert "largest |difference| 0.05" in differs.get_label()
    assert right.get_yscale() == left.get_yscale() == "linear"
    fig.canvas.draw()
    for ax in (left, right):
        assert all(float(t).is_integer() for t in ax.get_xticks())


def test_block_dtypes_one_box_per_op_casts_folded_coloured_by_output():
    ax = SAMPLES["plot_block_dtypes"]().axes[0]
    boxes = [to_rgb(p.get_facecolor()) for p in ax.patches]
    assert boxes == [to_rgb(PALETTE[k]) for k in ("fp32", "bf16", "fp32")]  # 2 casts folded in
    words = [t.get_text() for t in ax.texts]
    assert "fc: addmm" in words and any("2 inputs fp32 -> bf16" in w for w in words)
    assert any(w.startswith("add (") for w in words)  # in the module's own forward


def test_block_dtypes_of_a_real_block_under_cpu_autocast():
    from amp_tutorial.transformer import Block

    torch.manual_seed(0)
    block = Block(d_model=16, n_heads=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ops = trace_module(block, torch.randn(2, 4, 16))
    assert not block._forward_hooks and not block.ln1._forward_pre_hooks  # hooks removed
    assert [t.where for t in ops if t.op == "addmm"] == ["attn.qkv", "attn.proj", "mlp.fc",
                                                         "mlp.proj"]
    ax = plots.plot_block_dtypes(ops, "block").axes[0]
    names = [t.get_text() for t in ax.texts if ":" in t.get_text() or "(in the" in t.get_text()]
    colours = [to_rgb(p.get_facecolor()) for p in ax.patches]
    assert len(names) == len(colours)
    for name, colour in zip(names, colours, strict=True):
        if "addmm" in name:
            assert colour == to_rgb(PALETTE["bf16"]), name
        if "layer_norm" in name or name.startswith("add ("):  # residual stream stays fp32
            assert colour == to_rgb(PALETTE["fp32"]), name


def test_broken_and_fixed_side_by_side_with_each_lost_step_marked():
    nan, inf = float("nan"), float("inf")
    fig = plots.plot_broken_and_fixed(
        {"fp32": [0.48, 0.43, 0.40, 0.39], "AMP fp16": [nan, nan, inf, nan]},
        {"fp32": [0.48, 0.43, 0.40, 0.39], "AMP fp16": [0.48, 0.43, 0.40, 0.39]},
        "raw counts", broken_note="stem.0 in fp16", fixed_note="stem.0 in fp32")
    broken, fixed = fig.axes
    assert (broken.get_title(), fixed.get_title()) == ("broken: stem.0 in fp16",
                                                       "fixed: stem.0 in fp32")
    assert broken.get_shared_y_axes().joined(broken, fixed)  # one y axis: compare by eye
    assert broken.get_yscale() == "linear"  # 0.39 to 0.48: under a decade
    # every lost step of the broken fp16 run is a red x; the fixed panel has none
    (xs,) = broken.collections
    assert xs.get_offsets()[:, 0].tolist() == [1, 2, 3, 4]
    assert to_rgb(xs.get_edgecolors()[0][:3]) == to_rgb(MARKS["lost"])
    assert not fixed.collections
    labels = [t.get_text() for t in broken.get_legend().get_texts()]
    assert "AMP fp16: inf/NaN at 4 of 4 steps" in labels
    # fixed: the fp16 run drawn over the fp32 one, in its colour, dashed so both show
    fp32, fp16 = fixed.get_lines()
    assert to_rgb(fp16.get_color()) == to_rgb(PALETTE["fp16"]) and fp16.get_linestyle() == "--"
    assert to_rgb(fp32.get_color()) == to_rgb(PALETTE["fp32"])
    assert all(t == int(t) for t in fixed.get_xticks())  # whole steps


def test_utilization_keeps_each_whisker_and_its_printed_share_inside_the_axis():
    fig = plots.plot_utilization([("fp32", 0.065, 0.06)], "share of the matmul rate", "ladder")
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_xlim()[1] > 0.065 + 0.06  # the whisker's end is drawn
    (label,) = [t for t in ax.texts if t.get_text() == "6.5%"]
    box, frame = label.get_window_extent(), ax.get_window_extent()
    assert box.x1 <= frame.x1  # the share printed past the whisker is not cut off


def test_utilization_names_each_missing_rung_by_reason_under_the_bars():
    fig = plots.plot_utilization([("fp32", 0.065, 0.01)], "share of the matmul rate", "ladder",
                                 missing=[("AMP bf16", "bf16 is emulated"),
                                          ("AMP bf16 + compile", "left out here"),
                                          ("pure bf16", "bf16 is emulated")])
    (note,) = [t.get_text() for t in fig.texts]
    assert "- AMP bf16, pure bf16: bf16 is emulated" in note
    assert "- AMP bf16 + compile: left out here" in note
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    text_box = fig.texts[0].get_window_extent(renderer)
    axis_box = fig.axes[0].get_tightbbox(renderer)
    assert text_box.y1 < axis_box.y0 and text_box.x1 <= fig.bbox.x1  # under the axis, not cut
    empty = plots.plot_utilization([], "MFU", "ladder", missing=[("fp32", "no peak")])
    assert any("no rung has a MFU" in t.get_text() for t in empty.axes[0].texts)


def test_resume_labels_its_loss_axes_with_the_loss_it_plots():
    fig = plots.plot_resume([1.0, 0.8, 0.7, 0.6], {"resumed": [0.7, 0.6]}, 2, ylabel="MSE loss")
    left, right = fig.axes
    assert left.get_ylabel() == "MSE loss" and right.get_ylabel() == "MSE loss difference"
