"""The benchmark command: one row per mode, correct ratios, JSON output, clear errors."""

import json

import pytest

from amp_tutorial.ceiling import Ceiling, MatmulRate
from amp_tutorial.measure import CROWDED_SHARE, UNTIMED_PRESETS, Timing, cpu_wait_s
from tests.support import load_program

bench = load_program("bench")


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "out.json"
    assert bench.main(["--preset", "smoke", "--device", "cpu", "--no-progress",
                       "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_report_has_fp32_then_each_amp_dtype(smoke_report):
    modes = [r["mode"] for r in smoke_report["results"]]
    assert modes == ["fp32", "bf16"]
    assert smoke_report["preset"]["name"] == "smoke"
    assert smoke_report["device"] == "cpu"
    assert smoke_report["memory_format"] == "channels_last"  # the default layout


def test_ratios_are_against_fp32(smoke_report):
    fp32, bf16 = smoke_report["results"]
    assert fp32["train_speedup"] == fp32["activation_ratio"] == 1.0
    assert fp32["train_interval"] is None and fp32["train_noise"] is None  # the baseline
    # issue 57: the time ratios come from fresh models taking turns with fp32 and its twin, not
    # from the two runs' medians (timed one after the other, a load between them moves one)
    for part in ("train", "infer"):
        low, high = map(float, bf16[f"{part}_interval"].split("-"))
        assert low <= bf16[f"{part}_speedup"] <= high
        assert bf16[f"{part}_noise"] == UNTIMED_PRESETS["smoke"]  # never stated at smoke
    assert bf16["timed"] in ("wall time", "CPU time, one thread per run")
    assert bf16["activation_ratio"] == pytest.approx(
        bf16["saved_activation_bytes"] / fp32["saved_activation_bytes"])
    assert bf16["activation_ratio"] <= 0.55
    assert fp32["train_peak_bytes"] is None  # no allocator counter on CPU: reported as n/a
    assert not bf16["grad_scaler"]


def test_table_output(capsys):
    assert bench.main(["--preset", "smoke", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "preset: smoke" in out
    assert "\nfp32 " in out and "\nbf16 " in out
    assert "speedup = t_fp32 / t_mode" in out
    # the smoke preset states no ratio: the cells say so and the notes say why
    assert "no ratio for bf16 train: the smoke preset is too small to time" in out
    assert "bf16: no training ratio here (the smoke preset" in out


def test_json_to_stdout(capsys):
    bench.main(["--preset", "smoke", "--device", "cpu", "--no-progress", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["baseline"] == "fp32"


@pytest.mark.parametrize(("args", "message"), [
    (["--preset", "huge"], "valid names: auto, paper, cpu, small, smoke"),
    (["--device", "tpu"], "is not a device name"),
    (["--memory-format", "nhwc"], "invalid choice"),
])
def test_bad_input_exits_2_with_a_message(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def transformer_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "transformer.json"
    assert bench.main(["--preset", "smoke", "--device", "cpu", "--model", "transformer",
                       "--no-progress", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_transformer_flag_uses_the_same_report(transformer_report, smoke_report):
    assert transformer_report["model"] == "transformer" and smoke_report["model"] == "conv"
    assert transformer_report.keys() == smoke_report.keys()
    fp32, bf16 = transformer_report["results"]
    assert [fp32["mode"], bf16["mode"]] == ["fp32", "bf16"]
    low, high = map(float, bf16["train_interval"].split("-"))  # interleaved, as for conv
    assert low <= bf16["train_speedup"] <= high and bf16["train_noise"]  # smoke: not stated
    assert bf16["activation_ratio"] <= 0.6
    sizes = transformer_report["preset"]["transformer"]
    for r in (fp32, bf16):  # both learned the task on held-out sequences
        assert r["final_accuracy"] >= sizes["accuracy_target"]
    assert smoke_report["results"][0]["final_accuracy"] is None  # conv has no accuracy


def test_transformer_table_names_the_model_and_accuracy():
    results = [bench.ModeResult("fp32", None, False, 0.2, 0.01, 0.1, 0.01, None, None, 100, 0.5,
                                final_accuracy=0.97),
               bench.ModeResult("bf16", "bf16", False, 0.1, 0.01, 0.05, 0.01, None, None, 50, 0.5,
                                final_accuracy=0.96)]
    bench.add_ratios(results)
    info = bench.select_device("cpu")
    sizes = bench.get_preset("cpu").transformer
    table = bench.format_table(info, bench.get_preset("cpu"), results, model="transformer")
    assert f"model: transformer ({sizes.n_layers} layers, width {sizes.d_model}," in table
    assert f"seq {sizes.seq_len}, batch {sizes.batch}" in table
    assert "accuracy" in table and "0.960" in table and "2.00x" in table


def test_unknown_model_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", "resnet"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_compile_with_the_transformer_is_refused_clearly(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", "transformer", "--compile"])
    assert exit_info.value.code == 2
    assert "--compile runs the conv model only" in capsys.readouterr().err


@pytest.fixture(scope="module")
def compiled_report(tmp_path_factory):
    """The bench with ``--compile aot_eager`` (it captures the graph like inductor does but
    generates no code: a cheap compile), and, under ``"timed_calls"``, each ``time_steps`` call
    it made: its label (None for a first call on its own) and how many graphs Dynamo compiled
    during it."""
    from torch._dynamo.utils import counters

    path = tmp_path_factory.mktemp("bench") / "compiled.json"
    calls, time_steps = [], bench.time_steps

    def counting(step, n_steps, device, *args, **kwargs):
        before = counters["stats"]["unique_graphs"]
        out = time_steps(step, n_steps, device, *args, **kwargs)
        calls.append((kwargs.get("desc"), counters["stats"]["unique_graphs"] - before))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench, "time_steps", counting)
        assert bench.main(["--preset", "smoke", "--device", "cpu", "--no-progress",
                           "--compile", "aot_eager", "--json", str(path)]) == 0
    return json.loads(path.read_text()) | {"timed_calls": calls}


def test_compile_adds_compiled_rows_against_the_eager_baseline(compiled_report):
    modes = [r["mode"] for r in compiled_report["results"]]
    assert modes == ["fp32", "bf16", "fp32 compiled", "bf16 compiled"]
    assert compiled_report["compile"] == "aot_eager"
    eager_fp32, _, compiled_fp32, compiled_bf16 = compiled_report["results"]
    assert eager_fp32["train_compile_s"] is None
    assert compiled_bf16["train_speedup"] == pytest.approx(
        eager_fp32["train_median_s"] / compiled_bf16["train_median_s"])
    # the first call compiles and is timed on its own; no timed step compiles (read from Dynamo's
    # graph count, not from timings, which a loaded machine stretches past a cheap compile's)
    for r in (compiled_fp32, compiled_bf16):
        assert r["train_compile_s"] is not None and r["infer_compile_s"] is not None
    compiles = compiled_report["timed_calls"]
    first_calls = [graphs for desc, graphs in compiles if desc is None]
    assert len(first_calls) == 4 and all(graphs >= 1 for graphs in first_calls), compiles
    assert {desc: graphs for desc, graphs in compiles if desc is not None} == {
        f"{part} {mode}": 0 for part in ("train", "infer")
        for mode in ("fp32", "bf16", "fp32 compiled", "bf16 compiled")}, compiles
    # the same mathematics: compiled training ends where eager training does
    assert compiled_fp32["final_loss"] == pytest.approx(eager_fp32["final_loss"], rel=1e-3)
    assert compiled_bf16["activation_ratio"] <= 0.55


def test_the_same_run_measures_the_matmul_ceiling(smoke_report):
    ceiling = smoke_report["ceiling"]
    assert ceiling["sizes"] == list(bench.SIZES["smoke"])
    rates = {(r["n"], r["dtype"]): r for r in ceiling["rates"]}
    for n in ceiling["sizes"]:
        fp32, bf16 = rates[(n, "fp32")], rates[(n, "bf16")]
        low, high = bf16["gflops_q3_q1"]
        assert low <= bf16["gflops"] <= high
        # the ratio is fp32's time over bf16's (>1 when bf16 is faster), not the inverse
        assert ceiling["ratios"]["bf16"][str(n)] == pytest.approx(
            fp32["median_s"] / bf16["median_s"])
    fp32_row, bf16_row = smoke_report["results"]
    assert fp32_row["matmul_ceiling"] is None
    # the row's ceiling is the report's: the best ratio over the sizes whose timings are not
    # noise, or None with the reason (bf16 emulated, or every size noisy on a busy machine)
    assert bf16_row["matmul_ceiling"] == ceiling["ceilings"]["bf16"]
    for r in ceiling["rates"]:  # how long the calls waited for a CPU, where Linux says
        assert (r["wait_share"] is None) == (cpu_wait_s() is None)
        assert r["noisy"] or not r["wait_share"] or r["wait_share"] <= CROWDED_SHARE, r
    # only fp32's and bf16's rates count: a CPU with avx512_fp16 (a Xeon with AMX) also times
    # fp16, and a noisy fp16 rate says nothing about bf16's ceiling
    noisy = {r["n"] for r in ceiling["rates"] if r["noisy"] and r["dtype"] in ("fp32", "bf16")}
    quiet = [v for n, v in ceiling["ratios"]["bf16"].items() if int(n) not in noisy]
    if bf16_row["matmul_ceiling"] is None:
        assert "bf16" in ceiling["not_a_ceiling"]
        assert not quiet or "emulated" in ceiling["not_a_ceiling"]["bf16"]
    else:
        assert bf16_row["matmul_ceiling"] == pytest.approx(max(quiet))


def test_each_gain_is_printed_next_to_its_ceiling():
    results = [bench.ModeResult("fp32", None, False, 0.2, 0.01, 0.1, 0.01, None, None, 100, 0.5),
               bench.ModeResult("bf16", "bf16", False, 0.0976, 0.01, 0.04, 0.01, None, None, 50,
                                0.5)]
    bench.add_ratios(results)
    ceiling = Ceiling(tuple(
        MatmulRate(n, d, Timing((t,))) for n, d, t in
        [(1024, "fp32", 0.011), (1024, "bf16", 0.005), (2048, "fp32", 0.1),
         (2048, "bf16", 0.0625)]))
    bench.add_ceiling(results, ceiling)
    table = bench.format_table(bench.select_device("cpu"), bench.get_preset("cpu"), results,
                               ceiling=ceiling)
    assert "bf16: training 2.05x, inference 2.50x, of a 2.20x matmul ceiling" in table
    assert ("matmul 2048x2048: fp32 172 GFLOP/s (172-172); bf16 275 GFLOP/s (275-275), "
            "1.60x fp32") in table


def test_an_emulated_dtype_gets_no_ceiling_and_the_line_says_why():
    results = [bench.ModeResult("fp32", None, False, 0.2, 0.01, 0.1, 0.01, None, None, 100, 0.5),
               bench.ModeResult("bf16", "bf16", False, 0.9, 0.01, 0.4, 0.01, None, None, 50, 0.5)]
    bench.add_ratios(results)
    ceiling = Ceiling(tuple(MatmulRate(256, d, Timing((t,))) for d, t in
                            [("fp32", 0.001), ("bf16", 0.014)]), emulated=("bf16",))
    bench.add_ceiling(results, ceiling)
    assert results[1].matmul_ceiling is None  # not 0.07: that ratio bounds nothing here
    (line,) = bench.gain_lines(results, ceiling)
    assert line.startswith("bf16: training 0.22x, inference 0.25x, no matmul ceiling (bf16 "
                           "matmul 0.07x fp32 here, but bf16 is emulated")


def test_each_model_s_fp32_row_follows_that_model_s_tf32_setting():
    # ConvModel: cuDNN convolutions (TF32 by default); transformer: cuBLAS matmuls (IEEE)
    assert bench.FP32_LIKE == {"conv": "convolutions", "transformer": "matmuls"}
    assert set(bench.FP32_LIKE) == set(bench.MODELS)
