"""Every shared figure has a title and labelled axes, and shows what it is given."""

import matplotlib

matplotlib.use("agg")

import torch  # noqa: E402

from amp_tutorial import plots  # noqa: E402


def _labels(fig):
    return [(ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes
            if ax.get_label() != "<colorbar>"]


def test_dtype_ranges_has_one_row_per_dtype():
    fig = plots.plot_dtype_ranges()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fp32", "fp16", "bf16"]
    assert ax.get_title() and "log2" in ax.get_xlabel()


def test_image_and_outputs():
    image = torch.rand(1, 1, 8, 8)
    fig = plots.plot_image(image, "target")
    assert fig._suptitle.get_text() == "target"
    assert _labels(fig)[0][1:] == ("x (normalised)", "y (normalised)")
    fig = plots.plot_outputs({"target": image, "fp32": image[0, 0]}, "side by side")
    assert [ax.get_title() for ax in fig.axes] == ["target", "fp32"]
    assert fig._suptitle.get_text() == "side by side"


def test_losses_one_line_per_run():
    fig = plots.plot_losses({"fp32": [1.0, 0.5], "bf16": [1.0, 0.4]})
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["fp32", "bf16"]
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "step"


def test_bars_one_panel_per_metric():
    fig = plots.plot_bars({"time (ms)": {"fp32": 2.0, "bf16": 1.0},
                           "memory (MB)": {"fp32": 4.0, "bf16": 2.0}}, "comparison")
    assert [ax.get_title() for ax in fig.axes] == ["time (ms)", "memory (MB)"]
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [2.0, 1.0]


def test_op_times_one_bar_per_row_coloured_by_precision():
    rows = [{"op": "aten::mm", "input dtypes": "bf16, bf16", "self time (us)": 2000.0},
            {"op": "aten::add_", "input dtypes": "fp32, fp32", "self time (us)": 500.0}]
    fig = plots.plot_op_times(rows, "Ops of one step")
    ax = fig.axes[0]
    assert ax.get_title() == "Ops of one step" and "ms" in ax.get_xlabel()
    widths = sorted(p.get_width() for p in ax.patches[:2])
    assert widths == [0.5, 2.0]
    assert ax.patches[0].get_facecolor() != ax.patches[1].get_facecolor()


def test_gradient_magnitudes_shifts_by_the_scale():
    grads = torch.tensor([2.0**-30, 2.0**-20, 0.0, -(2.0**-10)])
    fig = plots.plot_gradient_magnitudes(grads, 2.0**16, "gradients")
    ax = fig.axes[0]
    assert ax.get_title() == "gradients" and "log2" in ax.get_xlabel() and ax.get_ylabel()
    true_bars, scaled_bars = ax.containers  # one histogram each; the zero is left out
    assert sum(b.get_height() for b in true_bars) == 3 == sum(b.get_height() for b in scaled_bars)
    lowest = min(b.get_x() for b in true_bars if b.get_height())
    assert lowest == -30 and min(b.get_x() for b in scaled_bars if b.get_height()) == -14


def test_scale_history_marks_the_skipped_steps():
    fig = plots.plot_scale_history([8.0, 8.0, 4.0, 4.0], [False, True, False], "scale",
                                   marked_step=1)
    ax = fig.axes[0]
    assert ax.get_title() == "scale" and ax.get_ylabel() == "scale (log2)"
    (marked,) = ax.collections
    assert marked.get_offsets().tolist() == [[1.0, 3.0]]  # step 1, log2(8)
