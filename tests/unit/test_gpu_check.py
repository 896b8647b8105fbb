"""course_tools.gpu_check: the command a lent GPU runs, run here on the CPU at smoke so it never
rots, and its time limits and budget on lessons made to hang.

The CPU run takes two lessons (01: figures, the IPython stand-in's matplotlib path; 10:
``display`` of a table) and every bench run: nbval already runs every lesson in CI, six times,
so running all of them again here would add minutes and check nothing new about the command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from course_tools.gpu_check import (
    BENCH_RUNS,
    NOT_DECIDABLE,
    NOT_REACHED,
    PASSED,
    ROOT,
    ROW_CHECKS,
    combine,
    decide_rows,
    find_lessons,
    peaks_outcome,
    register_ids,
)

STATUSES = {"passed", "failed", "not reached", "not decidable"}
CPU_LESSONS = ("01", "10")


def gpu_check(out: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "course_tools.gpu_check", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("gpu-check")
    # limits far above the few seconds each part takes, so a busy CI machine cannot kill one
    done = gpu_check(out, "--device", "cpu", "--preset", "smoke", "--lessons", *CPU_LESSONS,
                     "--budget", "1700", "--probe-limit", "300", "--lesson-limit", "600",
                     "--bench-limit", "600", "--bench-reserve", "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "verdict.json").read_text()), out, done.stdout


def test_the_cpu_run_passes_and_names_its_machine(cpu_run: tuple[dict, Path, str]) -> None:
    verdict, _, stdout = cpu_run
    assert verdict["complete"] and verdict["device"] == "cpu" and verdict["preset"] == "smoke"
    assert verdict["environment"]["torch"] == torch.__version__
    assert verdict["environment"]["gpu"] is None
    assert {name: p["status"] for name, p in verdict["parts"].items()} == {
        "probes": PASSED, "lessons": PASSED, "bench": PASSED}
    assert "lesson 01_autocast_basics: passed" in stdout  # progress is printed


def test_every_lesson_and_bench_run_has_a_verdict(cpu_run: tuple[dict, Path, str]) -> None:
    verdict, out, _ = cpu_run
    assert [e["lesson"][:2] for e in verdict["lessons"]] == list(CPU_LESSONS)
    for entry in verdict["lessons"]:
        assert entry["status"] == PASSED and entry["cells_passed"] == entry["cells_total"] > 5
        assert entry["max_memory_allocated"] is None  # a CPU has no allocator statistics
        assert entry["gpu_started"] is False  # the runner's record reaches the verdict (the H100
        # run of 2026-11-26 had None here, so its peak row could not have failed)
        assert (out / entry["log"]).is_file()
    assert [(e["model"], e["strict_fp32"]) for e in verdict["bench"]] == list(BENCH_RUNS)
    for entry in verdict["bench"]:
        report = json.loads((out / entry["json"]).read_text())
        assert report["ceiling"]["rates"], entry["name"]  # every run measured the ceiling
        assert report["model"] == entry["model"] and report["preset"]["name"] == "smoke"
        assert entry["summary"].startswith("fp32 ")


def test_every_register_row_is_in_both_verdict_files(cpu_run: tuple[dict, Path, str]) -> None:
    verdict, out, _ = cpu_run
    rows = {row["id"]: row for row in verdict["rows"]}
    assert list(rows) == register_ids()
    page = (out / "verdict.md").read_text()
    for row_id, row in rows.items():
        assert row["status"] in STATUSES and not row["decides"], row  # a CPU decides no row
        assert f"| {row_id} | {row['status']} |" in page
        check = ROW_CHECKS[row_id]
        if check.needs:
            assert row["status"] == NOT_DECIDABLE
        elif check.lessons and set(check.lessons) - set(CPU_LESSONS):
            assert row["status"] == NOT_REACHED and "not selected" in row["detail"]
        else:  # the checks that ran here all passed (the probe needs CUDA)
            assert row["status"] == (NOT_DECIDABLE if check.probe else PASSED), row


HANG = '''# %%
import time
print("first")

# %%
time.sleep(120)

# %%
print("never")
'''


def test_a_hanging_lesson_is_killed_and_the_budget_leaves_the_rest_not_reached(
        tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01_hang.py").write_text(HANG)
    (notebooks / "02_after.py").write_text('# %%\nprint("fine")\n')
    out = tmp_path / "out"
    done = gpu_check(out, "--device", "cpu", "--preset", "smoke", "--notebooks", str(notebooks),
                     "--parts", "lessons", "bench", "--budget", "12", "--lesson-limit", "8",
                     "--bench-reserve", "0", "--jobs", "1", timeout=120)
    verdict = json.loads((out / "verdict.json").read_text())
    assert done.returncode == 1 and verdict["complete"]
    hang, after = verdict["lessons"]
    assert hang["status"] == "failed" and hang["detail"].startswith("killed at its limit, 8 s")
    assert hang["seconds"] < 12
    if hang.get("cells"):  # torch imported within the limit: the cell that hung is named
        assert [c["status"] for c in hang["cells"]][1:] == ["failed", "not reached"]
        assert "in cell 2 ('time.sleep(120)')" in hang["detail"]
    assert after["status"] == NOT_REACHED and "budget" in after["detail"]
    assert {e["status"] for e in verdict["bench"]} == {NOT_REACHED}
    assert verdict["parts"]["probes"]["status"] == NOT_REACHED
    rows = {row["id"]: row for row in verdict["rows"]}
    assert rows["01-policy"]["status"] == "failed"
    assert rows["02-scaler"]["status"] == NOT_REACHED
    assert rows["ceiling-tf32"]["status"] == NOT_REACHED


def lesson(number: str, status: str, cells: list[dict[str, Any]] | None = None,
           detail: str = "") -> dict[str, Any]:
    return {"lesson": f"{number}_x", "status": status, "detail": detail, "cells": cells or []}


def test_a_row_follows_its_cell_when_the_lesson_failed_elsewhere() -> None:
    lessons = {"02": "02_gradient_scaling"}
    from course_tools.gpu_check import lesson_sources

    sources = lesson_sources(lessons["02"])
    marked = next(n for n, source in sources.items() if "unclipped" in source)
    cells = [{"cell": n, "status": "failed" if n == marked + 1 else PASSED,
              "error": "AssertionError: later"} for n in sources]
    verdict = {"device": "cuda", "environment": {"hip": None}, "probes": {}, "bench": [],
               "lessons": [{**lesson("02", "failed", cells, "cell 99: AssertionError: later"),
                            "lesson": lessons["02"]}]}
    rows = {r["id"]: r for r in decide_rows(verdict, ["02-bitwise", "02-scaler", "16-fp8"])}
    assert rows["02-bitwise"]["status"] == PASSED and rows["02-bitwise"]["decides"]
    assert rows["02-scaler"]["status"] == "failed"
    assert rows["16-fp8"]["status"] == NOT_REACHED  # lesson 16 did not run


def test_a_lesson_without_a_peak_fails_the_row_only_if_it_used_the_gpu() -> None:
    """Lesson 11 trains DDP in CPU child processes: on the H100 its process never started CUDA
    and had no peak, which is right; a lesson that started CUDA and has no peak is the bug."""
    def ran(name: str, peak: dict | None, started: bool | None) -> dict:
        return {"lesson": name, "status": PASSED, "cells": [{}], "gpu_started": started,
                "max_memory_allocated": peak}

    gpu = ran("03_amp_training", {"cuda:0": 2 << 30}, True)
    ddp = ran("11_amp_ddp", {}, False)
    assert peaks_outcome([gpu, ddp], on_cuda=True) == (
        PASSED, "1 lessons with a peak; no GPU in the process of 11_amp_ddp")
    lost = ran("12_amp_transformer", {}, True)
    assert peaks_outcome([gpu, ddp, lost], on_cuda=True)[0] == "failed"
    assert "12_amp_transformer" in peaks_outcome([gpu, lost], on_cuda=True)[1]
    unknown = ran("11_amp_ddp", {}, started=None)  # not recorded: no excuse for a missing peak
    assert peaks_outcome([gpu, unknown], on_cuda=True)[0] == "failed"
    assert peaks_outcome([ddp], on_cuda=False) == (PASSED, "1 lessons, null on a CPU")
    assert peaks_outcome([gpu], on_cuda=False)[0] == "failed"


def test_combine_reports_a_failure_before_what_was_not_reached() -> None:
    assert combine([(PASSED, "a"), (NOT_REACHED, "b"), ("failed", "c")]) == ("failed", "c")
    assert combine([(PASSED, "a"), (NOT_REACHED, "b")]) == (NOT_REACHED, "b")
    assert combine([(PASSED, "a"), (NOT_DECIDABLE, "needs a CUDA GPU")]) == (
        NOT_DECIDABLE, "needs a CUDA GPU")
    assert combine([(PASSED, "a"), (PASSED, "b")]) == (PASSED, "a; b")


def test_every_lesson_is_found_in_course_order() -> None:
    paths = find_lessons(ROOT / "notebooks")
    assert [p.name[:2] for p in paths] == [f"{n:02d}" for n in range(1, len(paths) + 1)]
    with pytest.raises(SystemExit, match="no lesson 99"):
        find_lessons(ROOT / "notebooks", ["99"])


@pytest.mark.parametrize(("flags", "env", "factor"), [
    ("fpu sse2 avx2 fma f16c", {}, 3.0),  # a Zen 3: bf16 emulated
    ("fpu avx2 avx512f avx512bw avx512_bf16", {}, 1.0),  # a Zen 4
    ("fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16", {}, 1.0),  # a Xeon with AMX
    ("fpu avx2 avx512f avx512_bf16", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, 3.0),  # capped as a Zen 3
])
def test_the_cpu_limits_follow_the_machine(flags, env, factor, tmp_path, monkeypatch) -> None:
    from course_tools.gpu_check import DEFAULT_BUDGET_S, LIMITS, cpu_limit_factor, parse_args
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cpu_limit_factor(str(cpuinfo)) == factor
    monkeypatch.setattr("course_tools.gpu_check.cpu_limit_factor", lambda: factor)
    args = parse_args([str(tmp_path / "out"), "--device", "cpu"])
    assert args.bench_limit == LIMITS["cpu"]["bench"] * factor
    assert args.budget == DEFAULT_BUDGET_S * factor
    assert parse_args([str(tmp_path / "out"), "--device", "cpu", "--bench-limit", "7"]
                      ).bench_limit == 7


# -- issue 46: a GPU path the lesson swallowed fails its row on a GPU, and only there -----------

FP8_FACTS = {"fp8_fast": True, "fp8_reason": "NVIDIA compute capability 9.0", "ready": True,
             "ready_reason": "torchao 0.18.0 on torch 2.11.0", "device": "cuda",
             "runs": ["bf16 AMP", "FP8 + bf16 AMP"]}
NO_TORCHAO = {**FP8_FACTS, "ready": False, "runs": [],
              "ready_reason": "torchao does not import on torch 2.11.0 (ModuleNotFoundError: "
              "No module named 'torchao')"}
INDUCTOR_FACTS = {"device": "cuda", "preset": "paper", "backend": "inductor",
                  "backend_reason": "Inductor, the default backend", "models": ["conv", "tf"],
                  "dtypes": ["fp32", "bf16"],
                  "runs": [[m, f"{k} {d}"] for m in ("conv", "tf") for k in ("eager", "compiled")
                           for d in ("fp32", "bf16")],
                  "messages": []}


def path_verdict(device: str, number: str, facts: dict[str, Any] | None,
                 capability: str | None = "9.0") -> dict[str, Any]:
    entry = {**lesson(number, PASSED, [{"cell": 1, "status": PASSED}]), "preset": "paper"}
    if facts is not None:
        entry["gpu_paths"] = facts
    return {"device": device, "preset": "paper", "probes": {}, "bench": [], "lessons": [entry],
            "environment": {"hip": None, "capability": capability if device == "cuda" else None}}


def row(verdict: dict[str, Any], row_id: str) -> dict[str, Any]:
    return decide_rows(verdict, [row_id])[0]


def test_fp8_that_did_not_run_on_an_fp8_gpu_fails_the_row() -> None:
    assert row(path_verdict("cuda", "16", FP8_FACTS), "16-fp8")["status"] == PASSED
    failed = row(path_verdict("cuda", "16", NO_TORCHAO), "16-fp8")
    assert failed["status"] == "failed" and failed["decides"]
    assert "lesson 16 ran no FP8 training: torchao does not import" in failed["detail"]
    blind = {**FP8_FACTS, "fp8_fast": False, "device": "cpu", "fp8_reason": "wrong"}
    assert "did not take the FP8 GPU path on compute capability 9.0" in row(
        path_verdict("cuda", "16", blind), "16-fp8")["detail"]
    assert row(path_verdict("cuda", "16", None), "16-fp8")["status"] == "failed"  # no record
    assert "no record" in row(path_verdict("cuda", "16", {"error": "KeyError: 'ready'"}),
                              "16-fp8")["detail"]
    # no FP8 matrix cores (an A100), or a CPU: skipping FP8 there is the lesson's right path
    assert row(path_verdict("cuda", "16", NO_TORCHAO, "8.0"), "16-fp8")["status"] == PASSED
    assert row(path_verdict("cpu", "16", NO_TORCHAO), "16-fp8")["status"] == PASSED
    assert row(path_verdict("cpu", "16", None), "16-fp8")["status"] == PASSED


def test_a_swallowed_inductor_compile_fails_the_row_on_a_gpu() -> None:
    assert row(path_verdict("cuda", "14", INDUCTOR_FACTS), "14-inductor")["status"] == PASSED
    lost = {**INDUCTOR_FACTS, "runs": INDUCTOR_FACTS["runs"][:-1],
            "messages": ["tf compiled bf16 failed: BackendCompilerFailed: triton"]}
    failed = row(path_verdict("cuda", "14", lost), "14-inductor")
    assert failed["status"] == "failed"
    assert failed["detail"].endswith("lesson 14 ran no tf compiled bf16: tf compiled bf16 "
                                     "failed: BackendCompilerFailed: triton")
    assert row(path_verdict("cuda", "14", lost), "14-device-profile")["status"] == "failed"
    smoke = {**INDUCTOR_FACTS, "backend": "aot_eager", "backend_reason": "smoke preset"}
    assert "compiled no run with Inductor" in row(path_verdict("cuda", "14", smoke),
                                                  "14-inductor")["detail"]
    assert row(path_verdict("cpu", "14", lost), "14-inductor")["status"] == PASSED


FAKE_16 = '''# %%
fp8_fast, fp8_reason = False, "no FP8 matrix cores here"
ready, ready_reason = False, "torchao does not import on torch x (ModuleNotFoundError)"
device = "cpu"
fp8_runs = {}
print(f"FP8 training skipped: {ready_reason}")
'''


def test_the_runner_records_the_lessons_gpu_path_from_its_namespace(tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "14_fake.py").write_text('# %%\nBACKEND = "inductor"\n')  # the rest missing
    (notebooks / "16_fake.py").write_text(FAKE_16)
    out = tmp_path / "out"
    done = gpu_check(out, "--device", "cpu", "--preset", "smoke", "--notebooks", str(notebooks),
                     "--parts", "lessons", "--commit", "0123abc", "--lesson-limit", "600",
                     "--budget", "1200", timeout=1300)
    verdict = json.loads((out / "verdict.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:]  # a CPU judges no GPU path
    assert verdict["commit"] == "0123abc"
    fourteen, sixteen = verdict["lessons"]
    assert fourteen["status"] == sixteen["status"] == PASSED
    assert fourteen["gpu_paths"]["error"].startswith("KeyError")
    assert sixteen["gpu_paths"] == {
        "fp8_fast": False, "fp8_reason": "no FP8 matrix cores here", "ready": False,
        "ready_reason": "torchao does not import on torch x (ModuleNotFoundError)",
        "device": "cpu", "runs": [],
        "messages": ["FP8 training skipped: torchao does not import on torch x "
                     "(ModuleNotFoundError)"]}
    # the same record from an H100 fails both rows
    on_gpu = {**verdict, "device": "cuda", "environment": {"hip": None, "capability": "9.0"}}
    rows = {r["id"]: r for r in decide_rows(on_gpu, ["14-inductor", "16-fp8"])}
    assert rows["16-fp8"]["status"] == rows["14-inductor"]["status"] == "failed"
    assert "lesson 16 ran no FP8 training: torchao does not import" in rows["16-fp8"]["detail"]
    assert "lesson 14 left no record of its GPU path (KeyError" in rows["14-inductor"]["detail"]


# -- issue 46: the preset each row ran at, and the commit --------------------------------------

def test_each_row_says_at_which_preset_it_ran(cpu_run: tuple[dict, Path, str]) -> None:
    verdict, _, _ = cpu_run
    assert verdict["commit"]  # git rev-parse HEAD here, or "unknown"
    rows = {r["id"]: r for r in verdict["rows"]}
    assert rows["01-policy"]["preset"] == "smoke" and rows["01-policy"]["claim_preset"] == "paper"
    assert rows["ceiling-tf32"]["preset"] == "smoke"
    assert rows["device-cuda-bf16"]["preset"] is None  # a probe: about no size
    assert rows["device-cuda-bf16"]["claim_preset"] is None
    assert rows["03-mps-saved"]["claim_preset"] is None
    mixed = {**verdict, "lessons": [{**verdict["lessons"][0], "preset": "cpu"}]}
    assert decide_rows(mixed, ["04-inference-peak", "01-policy"])[1]["preset"] == "cpu"
    both = {**verdict, "lessons": [{**e, "lesson": "04_x", "preset": "cpu"}
                                   for e in verdict["lessons"][:1]]}
    assert decide_rows(both, ["04-inference-peak"])[0]["preset"] == "cpu+smoke"


def test_the_commit_comes_from_the_flag_the_environment_or_git(tmp_path, monkeypatch) -> None:
    from course_tools.gpu_check import COMMIT_ENV, parse_args, resolve_commit
    monkeypatch.setenv(COMMIT_ENV, "feedbee")
    assert parse_args([str(tmp_path), "--device", "cpu", "--commit", "abc1234"]).commit == \
        "abc1234"
    assert parse_args([str(tmp_path), "--device", "cpu"]).commit == "feedbee"
    monkeypatch.delenv(COMMIT_ENV)
    monkeypatch.setattr("course_tools.gpu_check.ROOT", tmp_path)  # a copy without .git
    assert resolve_commit(None) == "unknown"
