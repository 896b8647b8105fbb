"""Measurement: per-step timing with warm-up, statistics, and exact saved-activation bytes."""

import gc
import math
import os
import time
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from amp_tutorial import measure
from amp_tutorial.measure import (
    StepTimer,
    Timing,
    activation_output_bytes,
    fresh_compile_cache,
    op_dtype_rows,
    peak_memory_bytes,
    reset_peak_memory,
    saved_bytes,
    step_peak,
    synchronize,
    time_steps,
)


def test_timing_statistics():
    t = Timing((4.0, 1.0, 3.0, 2.0, 5.0))
    assert t.median == 3.0
    assert (t.q1, t.q3, t.iqr) == (2.0, 4.0, 2.0)
    assert t.total == 15.0
    assert "3000.00 ms/step" in str(t) and "n=5" in str(t)


def test_step_timer_records_one_time_per_step_after_warmup():
    timer = StepTimer("cpu", warmup=2)
    for i in range(5):
        with timer.step():
            time.sleep(0.05 if i < 2 else 0.01)  # warm-up steps are slow, like a first kernel call
    assert timer.steps_seen == 5
    assert len(timer.samples) == 3  # one per step, the 2 warm-up steps left out
    assert all(0.009 < s < 0.045 for s in timer.samples)  # none of the slow warm-up steps
    assert len(timer.warmup_samples) == 2 and all(s >= 0.05 for s in timer.warmup_samples)
    timing = timer.timing
    assert timing.samples == tuple(timer.samples)
    assert min(timer.samples) <= timing.median <= max(timer.samples)
    assert timing.q1 <= timing.median <= timing.q3


def test_step_timer_measures_the_block_it_wraps():
    timer = StepTimer("cpu")
    with timer.step():
        time.sleep(0.03)
    with timer.step():
        pass
    slow, fast = timer.samples
    assert slow >= 0.03 > fast


def test_step_timer_records_nothing_for_a_step_that_raises():
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError), timer.step():
        raise RuntimeError("loss is nan")
    assert timer.samples == timer.warmup_samples == [] and timer.steps_seen == 0
    with pytest.raises(ValueError, match="no timed step yet"):
        timer.timing  # noqa: B018 - the property raises


def test_step_timer_syncs_a_gpu_before_each_clock_read(monkeypatch):
    # No GPU here: the sync hook is replaced by one that waits 20 ms like a queue draining, and
    # logs when it runs. The clock is real.
    events = []

    def fake_sync(device):
        events.append(("sync", torch.device(device).type))
        time.sleep(0.02)

    monkeypatch.setattr(measure, "synchronize", fake_sync)
    timer = StepTimer("cuda")
    for _ in range(2):
        with timer.step():
            events.append(("body", None))
    assert events == [("sync", "cuda"), ("body", None), ("sync", "cuda")] * 2
    # the closing sync is inside the timed window (the step's GPU work counts), the opening one not
    assert all(s >= 0.02 for s in timer.samples)


def test_synchronize_waits_on_gpus_and_does_nothing_on_cpu(monkeypatch):
    calls = []
    for backend in ("cuda", "mps", "xpu"):
        module = getattr(torch, backend)
        monkeypatch.setattr(module, "synchronize",
                            lambda *args, b=backend: calls.append(b), raising=False)
    synchronize("cpu")
    assert calls == []
    for backend in ("cuda", "mps", "xpu"):
        synchronize(backend)
    assert calls == ["cuda", "mps", "xpu"]


def test_step_timer_rejects_negative_warmup():
    with pytest.raises(ValueError, match="at least 0"):
        StepTimer("cpu", warmup=-1)


def test_time_steps_runs_warmup_untimed_and_times_each_step():
    calls = []

    def step(i):
        calls.append(i)
        time.sleep(0.01 if i >= 0 else 0.05)  # warm-up calls are slow, like a first kernel call
        return i * 2

    timing, results = time_steps(step, 4, "cpu", warmup=2, progress=False)
    assert calls == [-1, -2, 0, 1, 2, 3]
    assert results == [0, 2, 4, 6]
    assert len(timing.samples) == 4
    assert all(0.009 < s < 0.045 for s in timing.samples)  # the slow warm-up is not in the samples


def test_time_steps_keep_all_false_holds_only_the_last_output():
    alive = []  # weak references to every output a step returned

    def step(i):
        out = torch.zeros(1000)
        alive.append(weakref.ref(out))
        return out

    _, kept = time_steps(step, 5, "cpu", warmup=1, progress=False, keep_all=False)
    assert len(kept) == 1 and kept[0] is alive[-1]()
    assert [ref() is not None for ref in alive] == [False] * 5 + [True]  # the others are freed
    _, every = time_steps(step, 3, "cpu", progress=False)
    assert len(every) == 3 and all(ref() is not None for ref in alive[-3:])


def test_time_steps_rejects_zero_steps():
    with pytest.raises(ValueError, match="at least 1"):
        time_steps(lambda i: None, 0, "cpu")


def test_saved_bytes_counts_what_backward_needs():
    x = torch.rand(1000, requires_grad=True)
    # exp saves its output (1000 fp32 = 4000 bytes); sum saves nothing
    assert saved_bytes(lambda: x.exp().sum()).new == 4000


def test_saved_bytes_leaves_nothing_alive():
    """relu saves its own output; a pack hook that returned that tensor itself made a cycle
    through the graph, and every call leaked what the forward saved (found by course_tools.memory:
    lesson 03 kept 3.8 GB alive at paper)."""
    x = torch.randn(64, 64, requires_grad=True)
    outputs = []

    def forward() -> torch.Tensor:
        y = torch.relu(x)
        outputs.append(weakref.ref(y))
        return y.sum()

    assert saved_bytes(forward).activations == 64 * 64 * 4
    gc.collect()
    assert outputs[0]() is None, "the saved output is still alive after the count"


def test_saved_bytes_counts_each_storage_once_by_identity():
    """A view saved twice counts once; fake tensors (all at data address 0) count apart."""
    x = torch.rand(1000, requires_grad=True)
    y = x.exp()
    assert saved_bytes(lambda: (y[:10] * y[10:20]).sum()).new == 4000  # one storage
    with FakeTensorMode():
        a = torch.empty(1000, requires_grad=True)
        b = torch.empty(1000, requires_grad=True)
        assert saved_bytes(lambda: (a.exp() + b.exp()).sum()).new == 8000


def test_saved_activations_halve_under_bf16_autocast():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 32, 1), torch.nn.BatchNorm2d(32),
                                torch.nn.ReLU(), torch.nn.Conv2d(32, 1, 1))
    x = torch.rand(1, 2, 64, 64)
    fp32 = saved_bytes(lambda: model(x).sum(), model)

    def amp():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).sum()

    ratio = saved_bytes(amp, model).activations / fp32.activations
    assert 0.4 < ratio <= 0.55


def test_saved_bytes_leave_out_the_weights_and_count_autocast_s_copies():
    """Issue 57: four 2048x2048 Linear layers at batch 2. Counting every saved storage, fp32
    48 MiB and AMP 24 MiB said "AMP halves it"; fp32's are the parameters themselves (memory that
    exists anyway), AMP's are new 16-bit copies: AMP adds memory here."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])
    x = torch.randn(2, 2048)
    fp32 = saved_bytes(lambda: model(x).sum(), model)

    def amp():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).sum()

    low = saved_bytes(amp)  # the parameters are told apart without the model too
    weight = 2048 * 2048
    # backward keeps the weights of the last three layers (the first one's input needs no grad)
    assert fp32.held == 3 * weight * 4 + 0 and fp32.cast_weights == 0
    assert fp32.activations == 4 * 2 * 2048 * 4  # each layer's input (batch 2, fp32)
    assert low.cast_weights == 3 * weight * 2 and low.held == 0  # the bf16 copies, new memory
    assert low.activations == 4 * 2 * 2048 * 2 < fp32.activations
    assert low.new > 100 * fp32.new  # AMP adds memory: 24 MiB against 64 KiB
    assert "24.03 MiB new" in str(low)


def test_a_model_s_buffers_are_held_not_activations():
    model = torch.nn.BatchNorm1d(8)  # batch_norm saves its running statistics in training
    x = torch.randn(4, 8, requires_grad=True)
    with_model = saved_bytes(lambda: model(x).sum(), model)
    without = saved_bytes(lambda: model(x).sum())
    assert with_model.new + with_model.held == without.new + without.held
    assert with_model.held > without.held  # the running mean and variance, told apart


def test_activation_output_bytes_under_inference_mode():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.rand(10, 4)
    with torch.inference_mode():
        total = activation_output_bytes(model, lambda: model(x))
    assert total == (10 * 8 + 10 * 8 + 10 * 2) * 4
    assert not model[0]._forward_hooks  # hooks are removed afterwards


def test_cpu_has_no_allocator_peak():
    reset_peak_memory("cpu")
    assert peak_memory_bytes("cpu") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_gpu_peak_is_reset_between_runs():
    reset_peak_memory("cuda")
    big = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    del big
    assert peak_memory_bytes("cuda") >= 64 * 2**20
    reset_peak_memory("cuda")
    assert peak_memory_bytes("cuda") < 64 * 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_a_step_s_peak_counts_that_step_and_what_stays_resident():
    resident = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda")
    torch.empty(96 * 2**20, dtype=torch.uint8, device="cuda")  # freed: an earlier peak
    out, peak = step_peak(lambda: torch.ones(16 * 2**20, dtype=torch.uint8, device="cuda"),
                          "cuda")
    assert out.numel() == 16 * 2**20
    assert 48 * 2**20 <= peak < 96 * 2**20, peak  # the step and the resident, not the freed
    del resident


def test_a_step_s_peak_on_a_cpu_is_none_and_the_step_still_runs():
    calls = []
    out, peak = step_peak(lambda: calls.append(1) or "done", "cpu")
    assert (out, peak, calls) == ("done", None, [1])


def test_op_dtype_rows_show_autocast_matmuls_in_bf16_and_the_casts_from_fp32():
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a @ b
        a @ b  # the same matmul outside autocast: fp32
    rows = {(r["op"], r["input dtypes"]): r for r in op_dtype_rows(prof.events())}
    assert rows[("aten::mm", "bf16, bf16")]["calls"] == 1
    assert rows[("aten::mm", "fp32, fp32")]["calls"] == 1
    assert rows[("aten::_to_copy", "fp32")]["calls"] == 2  # autocast cast a and b down
    assert all(r["self time (us)"] >= 0 for r in rows.values())


def test_timing_columns_compare_against_the_baseline():
    from amp_tutorial.measure import Timing, timing_columns

    fp32, amp = Timing((0.011, 0.012, 0.013)), Timing((0.0048, 0.005, 0.0055))
    columns = timing_columns(amp, fp32, 3 * 2**20, "cpu")
    assert columns["time/step median (ms)"] == pytest.approx(5.0)
    assert columns["speedup (t_fp32 / t)"] == pytest.approx(12 / 5)
    assert columns["time/step IQR (ms)"] == pytest.approx(amp.iqr * 1e3)
    assert columns["peak memory (MB)"] == pytest.approx(3.0)
    assert math.isnan(timing_columns(amp, fp32, None)["peak memory (MB)"])
    # a spread over a quarter of the median, or the smoke preset: no speedup in the table
    noisy = Timing((0.004, 0.005, 0.009))
    assert math.isnan(timing_columns(noisy, fp32, None, "cpu")["speedup (t_fp32 / t)"])
    assert math.isnan(timing_columns(amp, fp32, None, "smoke")["speedup (t_fp32 / t)"])


def test_a_comparison_states_a_ratio_only_from_quiet_timings_at_a_timed_preset():
    from amp_tutorial.measure import NOISY_SPREAD, Comparison, Timing

    fp32, quiet = Timing((0.011, 0.012, 0.013)), Timing((0.0048, 0.005, 0.0055))
    slow = Timing((0.0235, 0.024, 0.025))
    # lesson 03's loaded run: fp32's spread (89 ms) above its median (54 ms)
    loaded = Timing((0.030, 0.040, 0.054, 0.100, 0.140))
    assert loaded.spread > 1 > NOISY_SPREAD >= quiet.spread
    said = Comparison("bf16", "fp32", quiet, fp32, "cpu")
    assert said.stated == pytest.approx(2.4) and "2.40x the speed of fp32" in str(said)
    assert "58% less time per step" in str(said)
    assert "100% more time per step" in str(Comparison("bf16", "fp32", slow, fp32, "cpu"))
    same = Comparison("bf16", "fp32", Timing((0.01195, 0.01199, 0.012)), fp32, "cpu")
    assert "1.00x" in str(same) and "the same time per step, to the percent" in str(same)
    for comparison, why in [(Comparison("bf16", "fp32", quiet, loaded, "small"), "fp32's spread"),
                            (Comparison("bf16", "fp32", loaded, fp32, "paper"), "bf16's spread"),
                            (Comparison("bf16", "fp32", quiet, fp32, "smoke"), "too small")]:
        assert comparison.stated is None and why in comparison.noise
        assert "compare" in str(comparison) and "x the speed" not in str(comparison)
        assert ("rerun on an idle machine" in str(comparison)) == (why != "too small")


def test_a_run_whose_threads_waited_for_a_cpu_gives_no_ratio():
    """The 9.06x of lesson 17 again, seen from inside: fp32's steps were each as slow as the
    other (a quiet spread) because a job beside them took half the cores all along."""
    from amp_tutorial.measure import CROWDED_SHARE, Comparison, Timing

    fp32 = Timing((0.099, 0.100, 0.101), waits=(0.001, 0.0, 0.002))
    amp = Timing((0.0495, 0.050, 0.0505), waits=(0.0, 0.0, 0.001))
    assert fp32.wait_share == pytest.approx(0.01) and not fp32.noisy
    assert Comparison("AMP bf16", "fp32", amp, fp32, "cpu").stated == pytest.approx(2.0)
    crowded = Timing((0.099, 0.100, 0.101), waits=(0.05, 0.06, 0.04))
    assert crowded.spread < CROWDED_SHARE < crowded.wait_share == pytest.approx(0.5)
    assert crowded.noisy and Timing((0.1,) * 3).wait_share is None  # waits not measured
    said = Comparison("AMP bf16", "fp32", amp, crowded, "cpu")
    assert said.stated is None and "x the speed" not in str(said)
    assert "fp32's threads waited for a CPU 50% of the time" in said.noise


def test_the_wait_share_is_per_thread_that_ran():
    """Lesson 03 said "threads waited for a CPU for 145% of its time": two threads' waits summed.
    Summed, the idle floor (about 1% per thread) would call every timing on a 32-thread CPU
    crowded."""
    t = Timing((0.1, 0.1, 0.1), waits=(0.146, 0.146, 0.146), threads=(2, 2, 2))
    assert t.wait_share == pytest.approx(0.73) and t.threads_ran == 2
    assert t.why_noisy == "2 threads waited for a CPU 73% of the time"
    idle_many = Timing((0.1,) * 3, waits=(0.032,) * 3, threads=(32,) * 3)
    assert idle_many.wait_share == pytest.approx(0.01) and not idle_many.noisy


def test_a_thread_that_ends_inside_a_step_takes_no_wait_away():
    """A probe gave -1.72 s (clamped to 0) when a thread ended inside a timed step: its whole
    wait left the second sum. Thread by thread, the others' waits still count."""
    before = {1: (1.0, 0.5), 2: (3.0, 2.0)}
    after = {1: (1.2, 0.6), 3: (0.1, 0.05)}  # thread 2 ended, thread 3 started
    waited, ran = measure.waited_between(before, after)
    assert waited == pytest.approx(0.15) and ran == 2


def test_without_per_thread_schedstat_there_is_no_wait_figure(monkeypatch):
    """A kernel with /proc but no schedstat: None (not measured), not 0.0 (measured idle)."""
    import builtins

    real_open = builtins.open

    def no_schedstat(path, *args, **kwargs):
        if str(path).endswith("/schedstat"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_schedstat)
    assert measure.thread_cpu_stats() is None and measure.cpu_wait_s() is None
    timer = StepTimer("cpu")
    with timer.step():
        pass
    assert timer.timing.wait_share is None and not timer.timing.waits


def test_a_figure_says_each_run_s_reason_for_no_ratio_once():
    """Lesson 14's ConvModel panel, rendered beside CI, printed "eager fp32's spread is 39% of its
    median" three times under its bars: once per run compared against it."""
    from amp_tutorial.measure import Comparison, Timing

    why_no_ratio = Comparison.why_no_ratio

    quiet, other = Timing((0.099, 0.100, 0.101)), Timing((0.049, 0.050, 0.051))
    loaded = Timing((0.06, 0.10, 0.14))
    crowded = Timing((0.049, 0.050, 0.051), waits=(0.05, 0.05, 0.05))
    assert why_no_ratio([Comparison("bf16", "fp32", other, quiet, "cpu")]) is None
    why = why_no_ratio(Comparison(n, "fp32", t, loaded, "cpu")
                       for n, t in (("bf16", other), ("compiled", crowded), ("compiled bf16",
                                                                             other)))
    assert why.count("fp32's spread is 40% of its median") == 1
    assert "compiled's threads waited for a CPU 100% of the time" in why
    assert "compiled bf16" not in why and why.endswith("the machine was busy")
    assert why_no_ratio([Comparison("bf16", "fp32", other, quiet, "smoke")]).startswith(
        "the smoke preset is too small")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(not (hasattr(os, "sched_setaffinity") and measure.cpu_wait_s() is not None),
                    reason="needs Linux's per-thread schedstat and CPU affinity")
def test_a_step_that_shares_its_core_with_another_program_is_crowded():
    # a busy loop pinned to one core beside another program's busy loop on the same core: the
    # scheduler gives each about half, so the step waits about half its time, on any machine
    import subprocess
    import sys

    mine = os.sched_getaffinity(0)
    cpu = min(mine)
    spinner = (f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); print('spinning', "
               "flush=True); end = time.perf_counter() + 60\nwhile time.perf_counter() < end: pass")
    hog = subprocess.Popen([sys.executable, "-c", spinner], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "spinning"
        os.sched_setaffinity(0, {cpu})  # this thread only; torch's threads keep theirs
        timer = StepTimer("cpu")
        for _ in range(3):
            with timer.step():
                _spin(0.2)
    finally:
        os.sched_setaffinity(0, mine)
        hog.kill()
        hog.wait()
    timing = timer.timing
    assert len(timing.waits) == 3 and timing.wait_share > measure.CROWDED_SHARE, timing.waits
    assert timing.noisy and "waited for a CPU" in timing.why_noisy


@pytest.mark.parametrize("before", [None, "/elsewhere/inductor-cache"])
def test_fresh_compile_cache_is_where_inductor_compiles_and_goes_away(monkeypatch, before):
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # how Inductor finds its cache

    if before is None:
        monkeypatch.delenv(measure.CACHE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(measure.CACHE_VARIABLE, before)
    with fresh_compile_cache() as folder:
        assert os.listdir(folder) == []  # nothing cached yet: the next compile is cold
        assert cache_dir() == folder
    assert not os.path.exists(folder)
    assert os.environ.get(measure.CACHE_VARIABLE) == before


def test_fresh_compile_cache_compiles_again_what_was_compiled_before():
    compiles = []

    def counting_backend(graph_module, example_inputs):
        compiles.append(graph_module)
        return graph_module.forward

    double = torch.compile(lambda x: x * 2, backend=counting_backend)
    x = torch.ones(3)
    double(x)
    double(x)
    assert len(compiles) == 1  # the second call reused the compiled code
    with fresh_compile_cache():
        double(x)
    assert len(compiles) == 2
