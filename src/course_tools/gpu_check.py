"""``python -m course_tools.gpu_check OUT``: the whole course checked on a GPU within a time budget,
with a verdict per lesson, per benchmark run and per row of ``docs/gpu-register.md``.

Made for the lent GPU machine (one NVIDIA H100, 15 minutes of device time per session, torch but
no jupytext, nbclient, IPython or torchao, no network): it needs only torch, the course's own
packages and what the lessons import, and it finishes inside ``--budget`` seconds (default 450:
under 8 minutes with the interpreter's start) whatever hangs. Three parts, in this order:

1. **probes** (``course_tools.gpu_probes``, one child process): the GPU, driver, torch and CUDA
   versions, and the register rows a probe decides;
2. **lessons**: every lesson top to bottom at the preset (``paper`` on a GPU: the sizes every GPU
   claim and each lesson's peak memory are about), each in a fresh process
   (``course_tools.lesson_exec``: reference answers in the exercise cells), ``--jobs`` at a time,
   longest first, each killed at ``--lesson-limit``; the allocator's ``max_memory_allocated``
   over each lesson is recorded on a GPU;
3. **bench** (``scripts/bench.py`` at the preset, alone on the device so its timings are clean):
   the ConvModel and the transformer, each plain and ``--strict-fp32``, each with the matmul
   ceiling, each killed at ``--bench-limit``; ``--bench-reserve`` seconds of the budget are kept
   for it while the lessons run.

A part that cannot start in the time left is "not reached", never missing: ``verdict.json`` and
``verdict.md`` in OUT are rewritten after every step, so even a run killed from outside leaves
complete files. Each register row is decided by a check (``ROW_CHECKS``): whole lessons, one
lesson cell (found by a piece of its code), the bench runs, a probe, or the lessons' peaks. Rows
about ROCm, MPS, XPU or several GPUs are "not decidable" on one CUDA GPU and say what they need.
``python -m course_tools.gpu_register fill OUT/verdict.json`` writes a GPU run's verdicts into the
register's column "last run on a GPU", with the preset each row ran at and the commit checked
(``--commit``, else ``AMP_TUTORIAL_COMMIT``, else ``git rev-parse HEAD`` where there is a ``.git``).

A lesson that passes on a CUDA GPU without taking its GPU path fails there: lessons 14 and 16 catch
a failing compile or ``import torchao`` so that they run on every machine, so the child that runs
a lesson also records what its GPU path left in its namespace (``PATH_FACTS``), and
``gpu_path_failure`` fails the lesson where Inductor did not compile every run or an FP8-capable
GPU (compute capability 8.9+) trained no FP8. On a CPU nothing is judged by it.

``--device cpu --preset smoke`` runs the same parts on a CPU (CI does, in
``tests/unit/test_gpu_check.py``); there no row is decided, but every check runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from course_tools import gpu_register

ROOT = Path(__file__).resolve().parents[2]
LESSON_NAME = re.compile(r"^\d\d_\w+\.py$")
MINUTES = re.compile(r"^#     minutes:\n((?:#       \w+: [\d.]+\n)+)", re.MULTILINE)
MEMORY = re.compile(r"^#     memory:\n((?:#       \w+: [\d.]+\n)+)", re.MULTILINE)
DEFAULT_BUDGET_S = 450.0
LIMITS = {  # per device kind: the limits of each probe, lesson and bench run, the bench's reserve
    # (seconds) and the lessons at a time
    "cuda": {"probe": 60.0, "lesson": 240.0, "bench": 90.0, "reserve": 170.0, "jobs": 4},
    "cpu": {"probe": 120.0, "lesson": 180.0, "bench": 120.0, "reserve": 60.0, "jobs": 1},
}
# On a CPU without native bf16 (no avx512_bf16 or amx_bf16, or oneDNN capped below them) every
# bf16 matmul takes ATen's reference gemm: the CPU limits are this many times longer there
# (bench-transformer at smoke took 68 s of its 120 s on a loaded 2-core Zen 3, and was killed
# at 120 s with more work beside it)
EMULATED_BF16_FACTOR = 3.0
BENCH_RUNS = (("conv", False), ("conv", True), ("transformer", False), ("transformer", True))
PRESET_ENV = "AMP_TUTORIAL_PRESET"  # as amp_tutorial.presets reads it
MIN_START_S = 5.0  # a part is not started with less time than this left
PASSED, FAILED, NOT_REACHED, NOT_DECIDABLE = "passed", "failed", "not reached", "not decidable"
COMMIT_ENV = "AMP_TUTORIAL_COMMIT"  # the commit checked, where the tree has no .git (the lent GPU)
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Check:
    """What decides a register row on a CUDA GPU: every lesson in ``lessons`` passing (or, with
    ``cell``, the code cell of the first one that contains that text), every bench run passing,
    a probe of ``course_tools.gpu_probes``, or every lesson's allocator peak recorded. ``needs``:
    the row is about a device one CUDA GPU is not, so nothing here decides it."""

    lessons: tuple[str, ...] = ()
    cell: str | None = None
    bench: bool = False
    probe: str | None = None
    peaks: bool = False
    needs: str | None = None

    @property
    def sized(self) -> bool:
        """Whether the row's claim is about a problem size: its check runs a lesson or the bench
        (every lesson's GPU claim is about ``paper``, docs/testing.md)."""
        return not self.needs and bool(self.lessons or self.bench or self.peaks)


ROW_CHECKS: dict[str, Check] = {
    "01-policy": Check(("01",)),
    "02-scaler": Check(("02",)),
    "02-bitwise": Check(("02",), cell="unclipped"),
    "03-allocator-peak": Check(("03",)),
    "03-interleaved": Check(("03", "04", "12", "13", "14", "15", "16", "17", "18")),
    "03-saved-halved": Check(("03",), cell='saved_bytes_on("cuda"'),
    "03-mps-saved": Check(needs="MPS"),
    "03-rocm-nhwc": Check(needs="ROCm"),
    "ceiling-tf32": Check(bench=True),
    "04-mps-outputs": Check(needs="MPS"),
    "04-inference-peak": Check(("04",), bench=True),
    "05-accumulation": Check(("05",)),
    "06-checker": Check(("06",)),
    "07-bce-refused": Check(("07",)),
    "07-mps-bce": Check(needs="MPS"),
    "07-custom-fwd": Check(("07",), cell="torch.amp.custom_fwd("),
    "07-contrastive": Check(("07",)),
    "08-old-spellings": Check(("08",)),
    "08-no-bf16": Check(needs="MPS or an XPU without bf16"),
    "08-13-mps-bound": Check(needs="MPS"),
    "09-10-fp16": Check(("09", "10")),
    "09-get-scale-sync": Check(("09",)),
    "10-cast-cache": Check(("10",)),
    "10-gradient-penalty": Check(("10",)),
    "10-dataparallel": Check(needs="2+ GPUs"),
    "11-multi-gpu": Check(needs="2+ GPUs"),
    "12-cross-entropy": Check(("12",)),
    "12-mps-linear": Check(needs="MPS"),
    "12-fp32-list": Check(("12",)),
    "13-flash": Check(("13",)),
    "13-masked-attention": Check(("13",)),
    "12-13-math-fallback": Check(needs="MPS, ROCm without AOTriton or XPU"),
    "12-allocator-peak": Check(("12",)),
    "14-inductor": Check(("14",)),
    "14-device-profile": Check(("14",)),
    "14-macos-kernel-names": Check(needs="a macOS CPU"),
    "15-no-bf16": Check(needs="MPS or an XPU without bf16"),
    "15-stochastic-rounding": Check(("15",)),
    "16-fp8": Check(("16",)),
    "17-profiler": Check(("17",)),
    "17-mps-linear": Check(needs="MPS"),
    "18-checkup": Check(("18",)),
    "17-math-fallback": Check(needs="MPS or a GPU on SDPA's math fallback"),
    "19-fsdp2-device": Check(("19",)),
    "19-fsdp2-multi-gpu": Check(needs="2+ GPUs"),
    "handout-allocator-peak": Check(peaks=True),
    "device-rocm-bf16": Check(needs="ROCm"),
    "device-cuda-bf16": Check(probe="cuda-bf16"),
    "device-xpu-bf16": Check(needs="XPU"),
}


def _facts_14(ns: dict[str, Any]) -> dict[str, Any]:
    """Lesson 14: the device, the compile backend, and which of the training runs it tried ran
    (each is in a ``try``: a failed compile prints a line and the lesson goes on)."""
    name = ns["dtype_name"]
    return {"device": ns["info"].type, "preset": ns["preset"].name, "backend": ns["BACKEND"],
            "backend_reason": str(ns["backend_reason"]), "models": list(ns["MODELS"]),
            "dtypes": [name(None), name(ns["LOW"])],
            "runs": [[r["model"], r["run"]] for r in ns["compile_runs"]]}


def _facts_16(ns: dict[str, Any]) -> dict[str, Any]:
    """Lesson 16: whether it saw FP8 matrix cores, whether torchao imported, where FP8 trained."""
    return {"fp8_fast": bool(ns["fp8_fast"]), "fp8_reason": str(ns["fp8_reason"]),
            "ready": bool(ns["ready"]), "ready_reason": str(ns["ready_reason"]),
            "device": str(ns["device"]), "runs": list(ns["fp8_runs"])}


# per lesson number: what its GPU path left in its namespace, read by the child after the run
PATH_FACTS = {"14": _facts_14, "16": _facts_16}
PATH_MESSAGE = re.compile(r"(failed|skipped): ")  # the lines a lesson prints for a swallowed path


def lesson_child(lesson: str, result: str) -> int:
    """A lesson's child process: ``course_tools.lesson_exec`` runs it, then what its GPU path left
    in the namespace (``PATH_FACTS``) is added to the result as ``gpu_paths``."""
    from course_tools import lesson_exec

    namespace: dict[str, Any] = {}
    outcome = lesson_exec.run_lesson(Path(lesson), Path(result), namespace=namespace)
    facts = PATH_FACTS.get(Path(lesson).name[:2])
    if facts is not None:
        try:
            outcome["gpu_paths"] = facts(namespace)
        except Exception as error:  # noqa: BLE001 - a renamed variable: the GPU run says so
            outcome["gpu_paths"] = {"error": lesson_exec.first_error_line(error)}
        tmp = Path(result).with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome, indent=1), encoding="utf-8")
        tmp.replace(Path(result))
    return 0 if outcome["first_error"] is None else 1


def on_cuda(verdict: dict[str, Any]) -> bool:
    """Whether the run was on an NVIDIA GPU (ROCm's device is ``cuda`` too)."""
    return str(verdict["device"]).startswith("cuda") and not verdict["environment"].get("hip")


def capability(verdict: dict[str, Any]) -> tuple[int, ...] | None:
    """The GPU's compute capability from the probes (``"9.0"`` -> ``(9, 0)``), if they ran."""
    text = verdict["environment"].get("capability")
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        return None


def _path_14(facts: dict[str, Any], verdict: dict[str, Any]) -> str | None:
    if facts["device"] != "cuda":
        return f"lesson 14 trained on {facts['device']}, not on the GPU"
    if facts["backend"] != "inductor":
        return (f"lesson 14 compiled no run with Inductor (backend {facts['backend']}: "
                f"{facts['backend_reason']})")
    ran = {tuple(run) for run in facts["runs"]}
    missing = [f"{model} {kind} {dtype}" for model in facts["models"]
               for kind in ("eager", "compiled") for dtype in facts["dtypes"]
               if (model, f"{kind} {dtype}") not in ran]
    if missing:
        said = "; ".join(facts.get("messages", [])[:2])
        return f"lesson 14 ran no {', '.join(missing)}" + (f": {said}" if said else "")
    return None


def _path_16(facts: dict[str, Any], verdict: dict[str, Any]) -> str | None:
    cc = capability(verdict)
    if not (cc >= (8, 9) if cc else facts["fp8_fast"]):
        return None  # no FP8 matrix cores: the lesson's CPU run is the right path
    if not facts["ready"]:
        return f"lesson 16 ran no FP8 training: {facts['ready_reason']}"
    where = f"compute capability {'.'.join(map(str, cc))}" if cc else "an FP8 GPU"
    if not facts["fp8_fast"]:
        return f"lesson 16 did not take the FP8 GPU path on {where}: {facts['fp8_reason']}"
    if not facts["device"].startswith("cuda") or not any("FP8" in run for run in facts["runs"]):
        return (f"lesson 16 ran no FP8 training on the GPU (device {facts['device']}, runs "
                f"{', '.join(facts['runs']) or 'none'})")
    return None


PATH_JUDGES = {"14": _path_14, "16": _path_16}


def gpu_path_failure(entry: dict[str, Any], verdict: dict[str, Any]) -> str | None:
    """Why a lesson that passed on an NVIDIA GPU did not run its GPU path (Inductor compiling
    each of lesson 14's runs; FP8 training in lesson 16 on compute capability 8.9+), or None.
    A swallowed or skipped GPU path is a failure there; on a CPU nothing is judged."""
    number = entry["lesson"][:2]
    judge = PATH_JUDGES.get(number)
    if judge is None or entry["status"] != PASSED or not on_cuda(verdict):
        return None
    facts = entry.get("gpu_paths")
    if not facts or "error" in facts:
        why = (facts or {}).get("error", "the runner recorded nothing")
        return f"lesson {number} left no record of its GPU path ({why})"
    try:
        return judge(facts, verdict)
    except (KeyError, TypeError) as error:
        return f"lesson {number}'s record of its GPU path is incomplete ({error!r})"


def resolve_commit(given: str | None) -> str:
    """The commit checked: ``--commit``, else ``AMP_TUTORIAL_COMMIT``, else ``git rev-parse HEAD``
    where the checkout has a ``.git`` (the lent GPU's copy has none), else "unknown"."""
    commit = given or os.environ.get(COMMIT_ENV)
    if commit:
        return commit.strip()
    if (ROOT / ".git").exists():
        try:
            done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                  capture_output=True, text=True, check=False, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return UNKNOWN
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return UNKNOWN


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def header_figures(pattern: re.Pattern[str], text: str) -> dict[str, float]:
    """A lesson header's ``minutes:`` or ``memory:`` block as ``{preset: number}``."""
    match = pattern.search(text)
    if not match:
        return {}
    pairs = re.findall(r"(\w+): ([\d.]+)", match.group(1))
    return {key: float(value) for key, value in pairs}


def find_lessons(notebooks: Path, wanted: Sequence[str] = ()) -> list[Path]:
    """The lessons (``NN_name.py``) in course order; ``wanted``: only these numbers or names."""
    paths = [p for p in sorted(notebooks.glob("[0-9][0-9]_*.py")) if LESSON_NAME.match(p.name)]
    if wanted:
        missing = [w for w in wanted if not any(w in (p.name[:2], p.stem, p.name) for p in paths)]
        if missing:
            raise SystemExit(f"error: no lesson {', '.join(missing)} in {notebooks}; the lessons "
                             f"are {' '.join(p.name[:2] for p in paths)}")
        paths = [p for p in paths if any(w in (p.name[:2], p.stem, p.name) for w in wanted)]
    return paths


class Budget:
    """Seconds left of the run's budget, counted from the start."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, keep: float = 0.0) -> float:
        return self.seconds - self.elapsed() - keep


def child_env(device: str, preset: str) -> dict[str, str]:
    """The environment of every child: the course's sources first, the device and the preset."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT),
                                       os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "AMP_TUTORIAL_DEVICE": device,
            PRESET_ENV: preset, "MPLBACKEND": "Agg", "TQDM_DISABLE": "1",
            "PYTHONUNBUFFERED": "1"}


class Child:
    """A child process in a session of its own (so a limit kills what it started too), its
    output in a log file."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, log: Path,
                 limit: float) -> None:
        self.limit = limit
        self.log = log
        self.started = time.monotonic()
        self._out = log.open("w", encoding="utf-8")
        self.process = subprocess.Popen(command, env=env, cwd=cwd, stdout=self._out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.timed_out = False

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def poll(self) -> int | None:
        """The exit status once it has ended; kills it at its limit (status then negative)."""
        code = self.process.poll()
        if code is None and self.seconds > self.limit:
            self.kill()
            code = self.process.wait()
        if code is not None:
            self._out.close()
        return code

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.2)
        return code

    def kill(self) -> None:
        self.timed_out = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def last_error_line(log: Path) -> str | None:
    """The exception line a Python traceback in ``log`` ends with (the last one), if any."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    errors = [line.strip() for line in lines
              if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", line.strip())]
    return errors[-1][:300] if errors else None


class Run:
    """One checking run: its plan, what each part gave, and the verdict files."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.budget = Budget(args.budget)
        self._cpu_mark = children_cpu_seconds()
        self.env = child_env(args.device, args.preset)
        self.lessons = find_lessons(args.notebooks, args.lessons)
        self.verdict: dict[str, Any] = {
            "schema": 1, "command": ["python", "-m", "course_tools.gpu_check", *args.argv],
            "started": now(), "finished": None, "seconds": 0.0, "complete": False,
            "device": args.device, "preset": args.preset, "commit": args.commit,
            "budget_s": args.budget,
            "jobs": args.jobs, "probe_limit_s": args.probe_limit,
            "lesson_limit_s": args.lesson_limit,
            "bench_limit_s": args.bench_limit, "bench_reserve_s": args.bench_reserve,
            "environment": {}, "parts": {},
            "probes": {},
            "lessons": [{"lesson": p.stem, "status": NOT_REACHED, "detail": "not started",
                         "preset": args.lesson_preset.get(p.name[:2], args.preset),
                         "seconds": None, "max_memory_allocated": None, "gpu_started": None,
                         "header_memory_mib": header_figures(MEMORY, p.read_text()).get(
                             "paper")} for p in self.lessons],
            "bench": [{"name": bench_name(model, strict), "model": model, "strict_fp32": strict,
                       "status": NOT_REACHED, "detail": "not started", "seconds": None}
                      for model, strict in BENCH_RUNS] if "bench" in args.parts else [],
            "rows": [],
        }
        self.write()

    def say(self, text: str) -> None:
        print(f"[{self.budget.elapsed():6.1f} s] {text}", flush=True)

    # -- parts ---------------------------------------------------------------------------------

    def probes(self) -> None:
        started = self.budget.elapsed()
        result_path = self.out / "probes.json"
        limit = min(self.args.probe_limit, self.budget.left())
        if limit < MIN_START_S:
            self.part("probes", started, NOT_REACHED)
            return
        self.say("probes: the machine's versions and the probe rows")
        child = Child([sys.executable, "-m", "course_tools.gpu_probes", self.args.device,
                       str(result_path)], self.env, ROOT, self.out / "probes.log", limit)
        code = child.wait()
        if code == 0 and result_path.is_file():
            result = json.loads(result_path.read_text())
            self.verdict["environment"] = result["environment"]
            self.verdict["probes"] = result["probes"]
            env = result["environment"]
            self.say(f"probes: {env.get('gpu') or env.get('cpu')}, driver {env.get('driver')}, "
                     f"torch {env.get('torch')}, CUDA {env.get('cuda')}")
            self.part("probes", started, PASSED)
        else:
            why = ("killed at its limit" if child.timed_out
                   else last_error_line(child.log) or f"exit status {code}")
            self.verdict["environment"] = {"error": why}
            self.say(f"probes: failed ({why})")
            self.part("probes", started, FAILED, why)

    def run_lessons(self) -> None:
        started = self.budget.elapsed()
        keep = self.args.bench_reserve if "bench" in self.args.parts else 0.0
        order = sorted(range(len(self.lessons)), key=lambda i: -header_figures(
            MINUTES, self.lessons[i].read_text()).get("cpu", 0.0))  # longest first
        running: dict[int, Child] = {}
        total, done = len(order), 0
        self.say(f"lessons: {total} at {self.args.preset}, {self.args.jobs} at a time, "
                 f"{self.budget.left(keep):.0f} s for them")
        while order or running:
            while order and len(running) < self.args.jobs:
                left = self.budget.left(keep)
                if left < MIN_START_S:
                    break
                index = order.pop(0)
                path = self.lessons[index]
                entry = self.verdict["lessons"][index]
                entry.update(status="running", detail="", limit_s=round(
                    min(self.args.lesson_limit, left), 1))
                preset = self.args.lesson_preset.get(path.name[:2], self.args.preset)
                entry["preset"] = preset
                running[index] = Child(
                    [sys.executable, "-c", "import sys; from course_tools.gpu_check import "
                     "lesson_child; sys.exit(lesson_child(*sys.argv[1:]))", str(path),
                     str(self.out / f"{path.stem}.json")], {**self.env, PRESET_ENV: preset},
                    path.parent, self.out / f"{path.stem}.log", min(self.args.lesson_limit, left))
                self.say(f"lesson {path.stem}: started")
            if not running:
                break
            time.sleep(0.3)
            for index, child in list(running.items()):
                code = child.poll()
                if code is None:
                    continue
                del running[index]
                done += 1
                entry = self.verdict["lessons"][index]
                self.lesson_verdict(entry, self.out / f"{self.lessons[index].stem}.json",
                                    child, code)
                peak = entry.get("max_memory_allocated") or {}
                peaks = ", ".join(f"{d} {b / 2**20:.0f} MiB" for d, b in peak.items())
                self.say(f"lesson {entry['lesson']}: {entry['status']} in {child.seconds:.1f} s"
                         f"{' (' + entry['detail'] + ')' if entry['detail'] else ''}"
                         f"{'; peak ' + peaks if peaks else ''} [{done}/{total}]")
                self.write()
        for entry in self.verdict["lessons"]:
            if entry["status"] == NOT_REACHED:
                entry["detail"] = "the budget was spent before it could start"
        status = PASSED if all(e["status"] == PASSED for e in self.verdict["lessons"]) else FAILED
        self.part("lessons", started, status)

    def lesson_verdict(self, entry: dict[str, Any], result_path: Path, child: Child,
                       code: int) -> None:
        entry["seconds"] = round(child.seconds, 1)
        entry["log"] = child.log.name
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = None
        if result is None:
            entry.update(status=FAILED, detail=(
                f"killed at its limit, {entry['limit_s']:.0f} s, before its first cell"
                if child.timed_out else last_error_line(child.log)
                or f"exit status {code}, no result"))
            return
        entry["max_memory_allocated"] = result.get("max_memory_allocated")
        entry["gpu_started"] = result.get("gpu_started")  # peaks_outcome needs both
        entry["cpu_s"] = result.get("cpu_s")
        entry["cells"] = result["cells"]
        counts = {s: sum(c["status"] == s for c in result["cells"])
                  for s in (PASSED, FAILED, "running", NOT_REACHED)}
        entry["cells_passed"], entry["cells_total"] = counts[PASSED], len(result["cells"])
        first = result.get("first_error")
        if child.timed_out:
            at = next((c for c in result["cells"] if c["status"] == "running"), None)
            where = f" in cell {at['cell']} ({at['first_line'][:60]!r})" if at else ""
            for cell in result["cells"]:
                if cell["status"] == "running":
                    cell.update(status=FAILED, error=f"killed at the limit, "
                                f"{entry['limit_s']:.0f} s")
            entry.update(status=FAILED,
                         detail=f"killed at its limit, {entry['limit_s']:.0f} s{where}")
        elif first is not None:
            cell = f"cell {first['cell']}: " if first.get("cell") else ""
            entry.update(status=FAILED, detail=f"{cell}{first['error']}")
        elif not result.get("finished"):
            entry.update(status=FAILED,
                         detail=last_error_line(child.log) or f"died (exit status {code})")
        else:
            entry.update(status=PASSED, detail="")
        if "gpu_paths" in result:  # lessons 14 and 16: their GPU path, and what they printed
            facts = result["gpu_paths"]
            if isinstance(facts, dict) and "error" not in facts:
                text = child.log.read_text(encoding="utf-8", errors="replace")
                facts["messages"] = [line.strip()[:300] for line in text.splitlines()
                                     if PATH_MESSAGE.search(line)][:5]
            entry["gpu_paths"] = facts
            why = gpu_path_failure(entry, self.verdict)
            if why:
                entry.update(status=FAILED, detail=why)

    def run_bench(self) -> None:
        started = self.budget.elapsed()
        for entry in self.verdict["bench"]:
            left = self.budget.left()
            if left < MIN_START_S:
                entry["detail"] = "the budget was spent before it could start"
                continue
            limit = min(self.args.bench_limit, left)
            json_path = self.out / f"{entry['name']}.json"
            command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--preset",
                       self.args.preset, "--device", self.args.device, "--model", entry["model"],
                       "--no-progress", "--json", str(json_path)]
            if entry["strict_fp32"]:
                command.append("--strict-fp32")
            self.say(f"bench {entry['name']}: started (limit {limit:.0f} s)")
            entry.update(status="running", detail="", limit_s=round(limit, 1))
            self.write()
            child = Child(command, self.env, ROOT, self.out / f"{entry['name']}.log", limit)
            code = child.wait()
            entry["seconds"] = round(child.seconds, 1)
            entry["log"] = child.log.name
            if code == 0 and json_path.is_file():
                entry.update(status=PASSED, detail="", json=json_path.name,
                             summary=bench_summary(json.loads(json_path.read_text())))
            else:
                entry.update(status=FAILED, detail=(
                    f"killed at its limit, {limit:.0f} s" if child.timed_out
                    else last_error_line(child.log) or f"exit status {code}"))
            self.say(f"bench {entry['name']}: {entry['status']} in {child.seconds:.1f} s"
                     f"{' (' + entry['detail'] + ')' if entry['detail'] else ''}"
                     f"{'; ' + entry['summary'] if entry.get('summary') else ''}")
            self.write()
        status = PASSED if all(e["status"] == PASSED for e in self.verdict["bench"]) else FAILED
        self.part("bench", started, status)

    def part(self, name: str, started: float, status: str, detail: str = "") -> None:
        cpu = children_cpu_seconds()
        self.verdict["parts"][name] = {"status": status, "detail": detail,
                                       "seconds": round(self.budget.elapsed() - started, 1),
                                       "cpu_s": round(cpu - self._cpu_mark, 1)}
        self._cpu_mark = cpu
        self.write()

    # -- verdict -------------------------------------------------------------------------------

    def finish(self) -> None:
        for name in ("probes", "lessons", "bench"):
            if name not in self.verdict["parts"]:
                reason = "not asked for (--parts)" if name not in self.args.parts else ""
                self.verdict["parts"][name] = {"status": NOT_REACHED, "detail": reason,
                                               "seconds": 0.0}
        self.verdict["finished"] = now()
        self.verdict["complete"] = True
        self.write()

    def write(self) -> None:
        self.verdict["seconds"] = round(self.budget.elapsed(), 1)
        self.verdict["rows"] = decide_rows(self.verdict, register_ids())
        for name, text in (("verdict.json", json.dumps(self.verdict, indent=1)),
                           ("verdict.md", render_markdown(self.verdict))):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(self.out / name)


def children_cpu_seconds() -> float:
    """CPU seconds (user and system) of every child this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_name(model: str, strict: bool) -> str:
    return f"bench-{model}{'-strict-fp32' if strict else ''}"


def bench_summary(report: dict[str, Any]) -> str:
    """One line: each AMP mode's training speedup over fp32, next to its matmul ceiling."""
    parts = []
    for result in report.get("results", [])[1:]:
        ceiling = result.get("matmul_ceiling")
        interval, noise = result.get("train_interval"), result.get("train_noise")
        said = f"{interval}, not stated: {noise}" if noise else interval
        parts.append(f"{result['mode']} {result['train_speedup']:.2f}x"
                     + (f" ({said})" if interval else "")
                     + (f" (ceiling {ceiling:.2f}x)" if ceiling else ""))
    base = report.get("results", [{}])[0]
    return (f"{base.get('mode', 'fp32')} {1000 * base.get('train_median_s', 0):.2f} ms/step; "
            + ", ".join(parts))


def register_ids(register: Path | None = None) -> list[str]:
    """The register's row ids (``course_tools.gpu_register``)."""
    text = (register or gpu_register.REGISTER).read_text(encoding="utf-8")
    return gpu_register.check_ids(gpu_register.read_table(text))


def decide_rows(verdict: dict[str, Any], ids: Sequence[str]) -> list[dict[str, Any]]:
    """Each register row's verdict from the checks that ran: passed, failed with the first
    error, not reached, or not decidable on this device. ``decides``: whether this run counts
    for the register (a CUDA GPU, the row not about another device)."""
    cuda = on_cuda(verdict)
    lessons = {entry["lesson"][:2]: entry for entry in verdict["lessons"]}
    rows = []
    for row_id in ids:
        check = ROW_CHECKS.get(row_id)
        status, detail = NOT_REACHED, ""
        if check is None:
            detail = "no check maps to this row (course_tools.gpu_check.ROW_CHECKS)"
        elif check.needs:
            status, detail = NOT_DECIDABLE, f"needs {check.needs}"
        else:
            outcomes = [lesson_outcome(lessons.get(n), check.cell if i == 0 else None, n,
                                       verdict) for i, n in enumerate(check.lessons)]
            if check.bench:
                outcomes += [(e["status"], f"{e['name']}: {e.get('summary') or e['detail']}")
                             for e in verdict["bench"]] or [(NOT_REACHED, "bench not run")]
            if check.probe:
                probe = verdict["probes"].get(check.probe)
                outcomes.append((probe["status"], probe["detail"]) if probe
                                else (NOT_REACHED, "probes not run"))
            if check.peaks:
                outcomes.append(peaks_outcome(verdict["lessons"], cuda))
            status, detail = combine(outcomes)
        rows.append({"id": row_id, "status": status, "detail": detail,
                     "decides": cuda and status != NOT_DECIDABLE and check is not None,
                     "preset": row_preset(verdict, check, lessons),
                     "claim_preset": gpu_register.CLAIM_PRESET if check and check.sized
                     else None})
    return rows


def row_preset(verdict: dict[str, Any], check: Check | None,
               lessons: dict[str, dict[str, Any]]) -> str | None:
    """The preset a row's check ran at (``cpu+paper`` where its lessons and bench differ), or
    None for a row whose check runs no lesson or bench (a probe)."""
    if check is None or not check.sized:
        return None
    default = verdict.get("preset") or UNKNOWN
    presets = {lessons[n].get("preset", default) for n in check.lessons if n in lessons}
    if check.bench:
        presets.add(default)
    if check.peaks:
        presets |= {e.get("preset", default) for e in verdict["lessons"]}
    return "+".join(sorted(presets)) or default


def lesson_outcome(entry: dict[str, Any] | None, cell_text: str | None, number: str,
                   verdict: dict[str, Any] | None = None) -> tuple[str, str]:
    """A lesson's outcome, or that of its first code cell containing ``cell_text``; a whole
    lesson that passed without its GPU path (``gpu_path_failure``) failed."""
    if entry is None:
        return NOT_REACHED, f"lesson {number} not selected"
    if entry["status"] in (NOT_REACHED, "running"):
        return NOT_REACHED, f"lesson {entry['lesson']} {entry['detail'] or 'not reached'}"
    name = entry["lesson"]
    if cell_text and entry.get("cells"):
        source = lesson_sources(name)
        cell = next((c for c in entry["cells"] if cell_text in source.get(c["cell"], "")), None)
        if cell is not None:
            if cell["status"] == PASSED:
                return PASSED, f"{name} cell {cell['cell']}"
            if cell["status"] == FAILED:
                return FAILED, f"{name} cell {cell['cell']}: {cell.get('error', '')}"
            return NOT_REACHED, f"{name} cell {cell['cell']} {cell['status']}"
    if entry["status"] == PASSED:
        why = gpu_path_failure(entry, verdict) if verdict is not None else None
        return (FAILED, f"{name}: {why}") if why else (PASSED, name)
    return FAILED, f"{name}: {entry['detail']}"


def lesson_sources(name: str) -> dict[int, str]:
    """``{code cell number: source}`` of a lesson of the checkout (answers swapped in)."""
    from course_tools.lesson_exec import read_cells

    path = ROOT / "notebooks" / f"{name}.py"
    try:
        return {cell.number: cell.source for cell in read_cells(path)}
    except (OSError, ValueError):
        return {}


def peaks_outcome(lessons: list[dict[str, Any]], on_cuda: bool) -> tuple[str, str]:
    """``handout-allocator-peak``: on a GPU every lesson that ran and started the GPU's runtime in
    its own process recorded a peak; on a CPU, which has no allocator statistics, none did."""
    ran = [e for e in lessons if e["status"] in (PASSED, FAILED) and e.get("cells")]
    if not ran:
        return NOT_REACHED, "no lesson ran"
    without = [e["lesson"] for e in ran if not e.get("max_memory_allocated")]
    if not on_cuda:
        if len(without) != len(ran):
            return FAILED, "a peak was recorded on a CPU"
        return PASSED, f"{len(ran)} lessons, null on a CPU"
    # a lesson may keep the GPU out of its own process (11 trains DDP in CPU children): no peak
    # is right only where the runner saw that the process never started the GPU's runtime
    missed = [e["lesson"] for e in ran
              if e.get("gpu_started") is not False and not e.get("max_memory_allocated")]
    if missed:
        return FAILED, f"no max_memory_allocated from {', '.join(missed)}, which used the GPU"
    return PASSED, (f"{len(ran) - len(without)} lessons with a peak"
                    + (f"; no GPU in the process of {', '.join(without)}" if without else ""))


def combine(outcomes: list[tuple[str, str]]) -> tuple[str, str]:
    """Failed if any failed (its detail), else not reached if any was, else not decidable if a
    probe could not decide here, else passed."""
    for status in (FAILED, NOT_REACHED, NOT_DECIDABLE):
        hit = [detail for s, detail in outcomes if s == status]
        if hit:
            return status, "; ".join(hit)
    return PASSED, "; ".join(detail for _, detail in outcomes)


def _md(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def render_markdown(verdict: dict[str, Any]) -> str:
    """The verdict as a page: the machine, the parts, each lesson, bench run and register row."""
    env = verdict["environment"]
    lines = [
        f"# GPU check: {verdict['device']} at `{verdict['preset']}`, commit "
        f"`{verdict.get('commit', UNKNOWN)}`", "",
        f"Started {verdict['started']}, {verdict['seconds']} s of a {verdict['budget_s']:.0f} s "
        f"budget{'' if verdict['complete'] else ' (still running or stopped from outside)'}. "
        f"GPU: {env.get('gpu') or 'none'} (compute capability {env.get('capability')}), "
        f"driver {env.get('driver')}, torch {env.get('torch')}, CUDA {env.get('cuda')}"
        f"{', HIP ' + str(env['hip']) if env.get('hip') else ''}, Python {env.get('python')}, "
        f"CPU {env.get('cpu')}.", "",
        "Command: `" + " ".join(verdict["command"]) + "`", "",
        "| part | status | seconds | CPU seconds | detail |", "| --- | --- | --- | --- | --- |",
        *(f"| {name} | {p['status']} | {p['seconds']} | {p.get('cpu_s', '')} | "
          f"{_md(p['detail'])} |" for name, p in verdict["parts"].items()), "",
        "## Lessons", "",
        "| lesson | status | seconds | CPU seconds | peak `max_memory_allocated` (MiB) | the "
        "header's memory at `paper`, counted on a CPU (MiB) | first error |",
        "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in verdict["lessons"]:
        peak = e.get("max_memory_allocated")
        peak_text = ", ".join(f"{d}: {b / 2**20:.0f}" for d, b in peak.items()) if peak else ""
        header = e.get("header_memory_mib")
        header_text = "" if header is None else f"{header:.0f}"
        name = e["lesson"] + (f" (at `{e['preset']}`)" if e.get("preset", verdict["preset"])
                              != verdict["preset"] else "")
        lines.append(f"| {name} | {e['status']} | {e['seconds'] or ''} | "
                     f"{e.get('cpu_s') or ''} | {peak_text} | {header_text} | {_md(e['detail'])} |")
    lines += ["", "## Bench", "", "| run | status | seconds | result |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {e['name']} | {e['status']} | {e['seconds'] or ''} | "
              f"{_md(e.get('summary') or e['detail'])} |" for e in verdict["bench"]]
    lines += ["", "## Register rows (docs/gpu-register.md)", "",
              "| id | status | decides the row | at preset | detail |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['id']} | {r['status']} | {'yes' if r['decides'] else 'no'} | "
              f"{r.get('preset') or ''} | {_md(r['detail'])} |" for r in verdict["rows"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m course_tools.gpu_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for verdict.json, verdict.md and the logs")
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--preset", default=None,
                        help="the lessons' and bench's preset (default: paper on a GPU, smoke on "
                        "a CPU)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S:.0f}, "
                        f"{EMULATED_BF16_FACTOR:g} times that on a CPU that emulates bf16)")
    parser.add_argument("--jobs", type=int, default=None, help="lessons at a time")
    parser.add_argument("--probe-limit", type=float, default=None, help="seconds for the probes")
    parser.add_argument("--lesson-limit", type=float, default=None, help="seconds per lesson")
    parser.add_argument("--bench-limit", type=float, default=None, help="seconds per bench run")
    parser.add_argument("--bench-reserve", type=float, default=None,
                        help="seconds of the budget the lessons leave to the bench")
    parser.add_argument("--parts", nargs="+", choices=("probes", "lessons", "bench"),
                        default=["probes", "lessons", "bench"])
    parser.add_argument("--lessons", nargs="+", default=(), metavar="NN",
                        help="only these lessons (by number or name)")
    parser.add_argument("--lesson-preset", nargs="+", default=[], metavar="NN=PRESET",
                        help="another preset for these lessons (14=cpu: a smaller size where "
                        "only the path matters)")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    parser.add_argument("--commit", default=None,
                        help=f"the commit checked, stamped into the verdict (default: "
                        f"${COMMIT_ENV}, else git rev-parse HEAD where there is a .git, else "
                        "unknown)")
    args = parser.parse_args(argv)
    try:
        args.lesson_preset = dict(item.split("=", 1) for item in args.lesson_preset)
    except ValueError:
        parser.error(f"--lesson-preset takes NN=PRESET, got {args.lesson_preset}")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.commit = resolve_commit(args.commit)
    if args.device is None:
        args.device = "cuda" if _has_cuda() else "cpu"
    kind = "cpu" if args.device == "cpu" else "cuda"
    args.preset = args.preset or ("smoke" if kind == "cpu" else "paper")
    factor = cpu_limit_factor() if kind == "cpu" else 1.0
    args.budget = args.budget or DEFAULT_BUDGET_S * factor
    args.jobs = args.jobs or LIMITS[kind]["jobs"]
    args.probe_limit = args.probe_limit or LIMITS[kind]["probe"] * factor
    args.lesson_limit = args.lesson_limit or LIMITS[kind]["lesson"] * factor
    args.bench_limit = args.bench_limit or LIMITS[kind]["bench"] * factor
    args.bench_reserve = (LIMITS[kind]["reserve"] * factor if args.bench_reserve is None
                          else args.bench_reserve)
    return args


def cpu_limit_factor(cpuinfo: str = "/proc/cpuinfo") -> float:
    """How much longer the CPU limits are on this CPU: ``EMULATED_BF16_FACTOR`` where bf16 is
    emulated, 1 where it is native. Read from the flags, without importing torch here."""
    capped = any(os.environ.get(name) for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"))
    try:
        flags = set(Path(cpuinfo).read_text(encoding="utf-8").split())
    except OSError:
        return 1.0
    native = bool({"avx512_bf16", "amx_bf16", "bf16"} & flags) and not capped
    return 1.0 if native else EMULATED_BF16_FACTOR


def _has_cuda() -> bool:
    """Whether a CUDA GPU is visible, asked of a child so this process holds no CUDA context."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    run.say(f"gpu_check: device {args.device}, preset {args.preset}, budget {args.budget:.0f} s, "
            f"{len(run.lessons)} lessons, parts {' '.join(args.parts)}; verdicts in {args.out}")
    if "probes" in args.parts:
        run.probes()
    if "lessons" in args.parts:
        run.run_lessons()
    if "bench" in args.parts:
        run.run_bench()
    run.finish()
    rows = run.verdict["rows"]
    counts = {s: sum(r["status"] == s for r in rows)
              for s in (PASSED, FAILED, NOT_REACHED, NOT_DECIDABLE)}
    run.say("done: register rows " + ", ".join(f"{n} {s}" for s, n in counts.items())
            + f"; {args.out / 'verdict.md'}")
    failed = any(p["status"] == FAILED for p in run.verdict["parts"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
