"""The ladder toward the hardware's limit and the width sweep (amp_tutorial.ladder)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from amp_tutorial.ceiling import SIZES, matmul_ceiling
from amp_tutorial.device import DeviceInfo, select_device
from amp_tutorial.interleave import BLOCKS
from amp_tutorial.ladder import (
    Rung,
    RungResult,
    SweepRow,
    amp_pays_from,
    ladder_rungs,
    matmul_rate_tflops,
    run_ladder,
    run_step,
    with_width,
)
from amp_tutorial.measure import UNTIMED_PRESETS, Timing
from amp_tutorial.mfu import Utilization
from amp_tutorial.presets import get_preset

CUDA = DeviceInfo(torch.device("cuda"), "CUDA 13.0", "NVIDIA H100 80GB HBM3",
                  (torch.bfloat16, torch.float16), True)


def test_every_rung_changes_one_thing_and_cuda_graphs_need_cuda():
    rungs = dict((r.name, why) for r, why in ladder_rungs(CUDA))
    assert all(why is None for why in rungs.values())
    assert list(rungs)[:6] == ["fp32", "AMP bf16", "AMP bf16 + fused AdamW", "AMP bf16 + compile",
                               "AMP bf16 + CUDA graphs", "AMP bf16 + batch x4"]
    assert {"AMP fp16 + batch x4", "pure bf16 + batch x4"} <= set(rungs)
    cpu = DeviceInfo(torch.device("cpu"), "CPU", "a CPU", (torch.bfloat16,), False)
    on_cpu = {r.name: (r, why) for r, why in ladder_rungs(cpu)}
    assert "CUDA graphs" in on_cpu["AMP bf16 + CUDA graphs"][1]
    assert on_cpu["AMP bf16 + batch x4"][0].compile_mode == "default"  # not the graphs rung's
    assert "not offered" in on_cpu["AMP fp16 + batch x4"][1]


def test_an_emulated_dtype_has_no_matmul_rate_to_be_measured_against():
    cpu = select_device("cpu")
    ceiling = matmul_ceiling(cpu, SIZES["smoke"], "matmuls", steps=3, budget_s=0.5)
    assert matmul_rate_tflops(ceiling, "fp32") == pytest.approx(
        max(r.gflops for r in ceiling.rates if r.dtype == "fp32" and not r.noisy) / 1e3
        if any(r.dtype == "fp32" and not r.noisy for r in ceiling.rates)
        else max(r.gflops for r in ceiling.rates if r.dtype == "fp32") / 1e3)
    if "bf16" in ceiling.emulated:
        assert matmul_rate_tflops(ceiling, "bf16") is None
    assert matmul_rate_tflops(None, "fp32") is None


def test_one_rung_measures_its_flops_rate_and_time_shares():
    info = select_device("cpu")
    sizes = get_preset("smoke").transformer
    row = run_step(info, sizes, Rung("fp32", "the baseline"), None, max_steps=3, budget_s=0.1)
    u = row.utilization
    assert row.tokens == sizes.batch * sizes.seq_len
    assert u.flops > 0 and u.tflops == pytest.approx(u.flops / row.timing.median / 1e12)
    assert u.mfu is None and u.of_matmul is None  # no peak for a CPU, no ceiling given
    assert row.shares is not None and row.as_dict()["time_shares"] == row.shares.shares
    # its own matmuls' rate: the weights' matmul FLOPs over the profile's matmul seconds
    assert 0 < row.matmul_flops < u.flops and row.matmul_of_rate is None  # no ceiling given
    assert row.matmul_tflops == pytest.approx(
        row.matmul_flops / row.shares.seconds["matmul"] / 1e12)
    bigger = run_step(info, sizes, dataclasses.replace(row.rung, batch_scale=2), None,
                      max_steps=3, budget_s=0.1, profile=False)
    assert bigger.utilization.flops == 2 * u.flops  # twice the tokens, twice the model FLOPs


def test_a_step_s_own_matmuls_are_read_against_the_measured_rate():
    """The CPU ladder at width 2048 reached 42% of the bf16 matmul rate with 68% of its step in
    matmuls: the matmuls themselves ran at 62% of the rate. Which part falls short is this."""
    from amp_tutorial.step_profile import GROUPS, TimeShares

    seconds = dict.fromkeys(GROUPS, 0.0) | {"matmul": 3.0, "attention": 1.5}
    row = RungResult(Rung("AMP bf16", ""), 8192, timing=Timing((4.5,) * 3),
                     utilization=Utilization(5e12, 4.5, None, 2.5),
                     shares=TimeShares(seconds, 4.5, "CPU ops"), matmul_flops=int(4.8e12))
    assert row.matmul_tflops == pytest.approx(1.6) and row.matmul_of_rate == pytest.approx(0.64)
    assert row.as_dict()["step_matmul_of_matmul"] == pytest.approx(0.64)
    unprofiled = dataclasses.replace(row, shares=None)
    assert unprofiled.matmul_tflops is None and unprofiled.matmul_of_rate is None
    no_rate = dataclasses.replace(row, utilization=Utilization(5e12, 4.5, None, None))
    assert no_rate.matmul_tflops == pytest.approx(1.6) and no_rate.matmul_of_rate is None


def test_the_ladder_runs_at_a_width_given_in_heads_of_64_channels():
    info = select_device("cpu")
    sizes = get_preset("smoke").transformer
    wide = with_width(sizes, 2 * sizes.d_model)
    assert (wide.d_model, wide.n_heads) == (2 * sizes.d_model, 2 * sizes.d_model // 64)
    assert dataclasses.replace(wide, d_model=sizes.d_model, n_heads=sizes.n_heads) == sizes
    rows = [run_step(info, s, Rung("fp32", "the baseline"), None, max_steps=2, budget_s=0.1,
                     profile=False) for s in (sizes, wide)]
    assert rows[1].utilization.flops > 2 * rows[0].utilization.flops  # matmuls grow as width^2
    with pytest.raises(ValueError, match="multiple of 64"):
        with_width(sizes, 100)


def test_rungs_past_the_deadline_or_failing_are_rows_that_say_why(monkeypatch):
    import amp_tutorial.ladder as ladder

    def fail(*_args, **_kwargs):
        raise RuntimeError("inductor exploded\nsecond line")

    monkeypatch.setattr(ladder, "run_step", fail)
    info = select_device("cpu")
    rows = run_ladder(info, get_preset("smoke").transformer, None)
    ran = [r for r, why in ladder_rungs(info) if why is None]
    assert [r.skipped for r in rows if r.rung in ran] == ["failed: second line"] * len(ran)
    rows = run_ladder(info, get_preset("smoke").transformer, None, deadline=0.0)
    assert all(r.skipped.startswith("not reached") for r in rows if r.rung in ran)


def test_the_eager_rungs_are_compared_with_fp32_taking_turns(monkeypatch):
    """The ladder's rungs run one after another (each its own ms/step and MFU); the ratios
    against fp32 come from a second pass in which the eager rungs at fp32's tokens, built again,
    take turns with fp32 and its twin (issue 57: a load that came or went moved some rungs and
    not others)."""
    import amp_tutorial.ladder as ladder

    def fake_step(info, sizes, rung, ceiling, *_args, **_kwargs):  # the first pass, timed apart
        return RungResult(rung, sizes.batch * rung.batch_scale * sizes.seq_len,
                          timing=Timing((0.01,) * 3))

    built = []
    real_build = ladder.build_step

    def counting_build(info, sizes, rung, d_model=None):
        built.append(rung.name)
        return real_build(info, sizes, rung, d_model)

    monkeypatch.setattr(ladder, "run_step", fake_step)
    monkeypatch.setattr(ladder, "build_step", counting_build)
    info = select_device("cpu")
    rows = run_ladder(info, get_preset("smoke").transformer, None, compiled=False,
                      preset="smoke")
    same = [r for r in rows if r.timing is not None and r.tokens == rows[0].tokens]
    assert [r.rung.name for r in same] == ["fp32", "AMP bf16", "AMP bf16 + fused AdamW"]
    assert built == ["fp32", "AMP bf16", "AMP bf16 + fused AdamW", "fp32"]  # fp32's twin last
    for r in same[1:]:
        c = r.comparison
        assert c.name == r.rung.name and c.baseline_name == "fp32" and c.estimate.blocks == BLOCKS
        assert c.noise == UNTIMED_PRESETS["smoke"] and c.stated is None  # smoke: never stated
        assert r.as_dict()["vs_first"]["why_not_stated"] == c.noise
    # the first rung, and rungs at 4x the tokens (another step's work), get no comparison
    assert all(r.comparison is None for r in rows if r not in same[1:])
    built.clear()  # past the deadline: no second pass
    rows = run_ladder(info, get_preset("smoke").transformer, None, deadline=0.0)
    assert built == [] and all(r.comparison is None for r in rows)


def _row(width: int, mode: str, ms: float) -> SweepRow:
    result = RungResult(Rung(mode, ""), 512, timing=Timing((ms / 1e3,) * 3))
    return SweepRow(width, 512, mode, result)


def test_amp_pays_from_the_width_after_which_it_always_wins():
    rows = [_row(64, "fp32", 1), _row(64, "AMP bf16", 2), _row(128, "fp32", 3),
            _row(128, "AMP bf16", 2), _row(256, "fp32", 9), _row(256, "AMP bf16", 4)]
    assert amp_pays_from(rows, 512) == 128
    rows[-1] = _row(256, "AMP bf16", 10)  # wins at 128 only: no width from which it pays
    assert amp_pays_from(rows, 512) is None


def test_the_figures_come_from_a_saved_report_and_name_each_rungs_peak():
    rung = {"name": "AMP bf16", "mfu": 0.2, "of_matmul": 0.4, "peak_tflops": 989.5,
            "median_s": 0.01, "iqr_s": 0.001,
            "time_shares": {"matmul": 0.5, "attention": 0.1, "memory-bound": 0.2,
                            "optimizer": 0.1, "idle": 0.1}}
    sweep = [{"mode": mode, "tokens": 512, "d_model": w, "mfu": 0.1 * w / 64,
              "of_matmul": 0.5, "median_s": 0.01} for mode in ("fp32", "AMP bf16")
             for w in (64, 128)]
    from amp_tutorial.ladder import ladder_figures

    with_peak = ladder_figures({"peak": {"name": "x"}, "device_name": "GPU", "ladder": [rung],
                                "sweep": sweep})
    assert set(with_peak) == {"ladder", "time-shares", "sweep"}
    labels = [t.get_text() for t in with_peak["ladder"].axes[0].get_yticklabels()]
    assert labels == ["AMP bf16 (of 989.5 TFLOP/s)"]
    cpu = ladder_figures({"peak": None, "device_name": "CPU",
                          "ladder": [dict(rung, mfu=None)], "sweep": []})
    assert set(cpu) == {"ladder", "time-shares"}  # measured against the matmul rate instead
    assert "matmul rate" in cpu["ladder"].axes[0].get_xlabel()
    # a rung that was skipped has no profile: the time-share figure names it and says why
    skipped = {"name": "AMP bf16 + CUDA graphs", "skipped": "CUDA graphs need a CUDA device"}
    shares = ladder_figures({"peak": None, "device_name": "CPU", "ladder": [rung, skipped],
                             "sweep": []})["time-shares"]
    assert [t.get_text() for t in shares.axes[0].get_yticklabels()] == ["AMP bf16"]
    note = " ".join(t.get_text() for t in shares.texts).replace("\n  ", " ")
    assert "Not drawn:" in note and f"{skipped['name']}: {skipped['skipped']}" in note
    drawn = ladder_figures({"peak": None, "device_name": "CPU", "ladder": [rung], "sweep": []})
    assert not drawn["time-shares"].texts  # all profiled: no note


def test_a_rung_timed_while_the_machine_was_busy_is_drawn_pale_with_why():
    """Lesson 17 rendered beside CI: every rung NOISY in its table, yet the ladder figure drew
    each share of the matmul rate as a result (pure bf16 at 51.8%, fp32 at 30.0%)."""
    from amp_tutorial.ladder import ladder_figures

    quiet = {"name": "fp32", "of_matmul": 0.7, "median_s": 0.3, "iqr_s": 0.01, "noisy": False,
             "wait_share": 0.01}
    busy = {"name": "AMP bf16", "of_matmul": 0.3, "median_s": 0.1, "iqr_s": 0.01,
            "noisy": True, "wait_share": 1.0}
    spread = {"name": "pure bf16 + batch x4", "of_matmul": 0.5, "median_s": 0.4,
              "iqr_s": 0.2, "noisy": True}  # no wait_share: a report from before it
    fig = ladder_figures({"peak": None, "device_name": "CPU", "ladder": [quiet, busy, spread],
                          "sweep": []})["ladder"]
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    alpha = {label: bar.get_alpha() for label, bar in zip(labels, ax.patches, strict=True)}
    assert alpha == {"fp32": None, "AMP bf16": 0.45, "pure bf16 + batch x4": 0.45}
    note = " ".join(t.get_text() for t in fig.texts).replace("\n  ", " ")
    assert note.startswith("Pale, timed while the machine was busy (no result):")
    assert "AMP bf16: threads waited for a CPU 100% of the time" in note
    assert "pure bf16 + batch x4: spread is 50% of its median" in note and "fp32" not in note


def test_without_compiling_the_rungs_built_on_compile_run_eager(monkeypatch):
    import amp_tutorial.ladder as ladder

    seen = []

    def record(info, sizes, rung, *_args, **_kwargs):
        seen.append(rung)
        return RungResult(rung, sizes.batch * rung.batch_scale * sizes.seq_len)

    monkeypatch.setattr(ladder, "run_step", record)
    rows = run_ladder(CUDA, get_preset("smoke").transformer, None, compiled=False)
    assert all(r.compile_mode is None for r in seen)
    names = {r.name for r in seen}
    assert {"AMP bf16 + batch x4", "AMP fp16 + batch x4", "pure bf16 + batch x4"} <= names
    skipped = {r.rung.name: r.skipped for r in rows if r.skipped}
    assert set(skipped) == {"AMP bf16 + compile", "AMP bf16 + CUDA graphs"}
    assert next(r for r in seen if r.name == "AMP bf16 + batch x4").change.endswith("(eager here)")


def test_the_ladder_figure_says_why_each_rung_it_does_not_draw_is_missing(monkeypatch):
    """A CPU with bf16 emulated and the compiled rungs left out: the share of the matmul rate
    exists for fp32 only; every other rung is named under the bars with its reason."""
    import amp_tutorial.ladder as ladder
    from amp_tutorial.ceiling import Ceiling, MatmulRate
    from amp_tutorial.ladder import ladder_figures, ladder_report
    from amp_tutorial.mfu import Utilization

    def fake_step(info, sizes, rung, ceiling, *_args, **_kwargs):
        row = RungResult(rung, sizes.batch * rung.batch_scale * sizes.seq_len,
                         timing=Timing((0.010, 0.011, 0.012)), final_loss=1.0)
        row.utilization = Utilization(10**9, 0.011, None,
                                      matmul_rate_tflops(ceiling, rung.compute or "fp32"))
        return row

    monkeypatch.setattr(ladder, "run_step", fake_step)
    cpu = DeviceInfo(torch.device("cpu"), "CPU", "a CPU", (torch.bfloat16,), False)
    ceiling = Ceiling(tuple(MatmulRate(256, d, Timing((0.001, 0.001, 0.001)))
                            for d in ("fp32", "bf16")), emulated=("bf16",))
    sizes = get_preset("smoke").transformer
    rows = run_ladder(cpu, sizes, ceiling, compiled=False)
    report = ladder_report(cpu, ceiling, rows)
    by_name = {r["name"]: r for r in report["ladder"]}
    assert "emulated" in by_name["AMP bf16"]["why_no_of_matmul"]
    assert "why_no_of_matmul" not in by_name["fp32"] and by_name["fp32"]["why_no_mfu"]
    fig = ladder_figures(report)["ladder"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fp32"]
    assert f"1 of {len(rows)} rungs drawn" in ax.get_title()
    note = "\n".join(t.get_text() for t in fig.texts).replace("\n  ", " ")
    for r in report["ladder"][1:]:  # each missing rung by name, with the reason from the data
        assert r["name"] in note and (r["skipped"] or r["why_no_of_matmul"]) in note, r["name"]
    assert "compiled=False" in note and "fp16 is not offered" in note
    # no matmul rate at all: the figure is still drawn, empty, and says why
    rows = run_ladder(cpu, sizes, None, compiled=False)
    empty = ladder_figures(ladder_report(cpu, None, rows))["ladder"]
    assert f"0 of {len(rows)} rungs drawn" in empty.axes[0].get_title()
    assert "no matmul rate was measured" in empty.texts[0].get_text().replace("\n  ", " ")
    assert any("no rung has" in t.get_text() for t in empty.axes[0].texts)
