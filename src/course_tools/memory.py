"""``python -m course_tools.memory``: the GPU memory a lesson needs per learner, measured on a CPU.

For each lesson, the peak of live tensor memory (parameters, gradients, optimizer state,
activations, the temporaries kernels allocate, compiled code's buffers) at a preset, ``paper``
by default, the size a GPU runs. No GPU is needed: each lesson runs top to bottom in a fresh
kernel on the CPU (the handout's runner, ``course_tools.handout.run_notebook``, with the reference
answers in the exercise cells), and two cells of the tool's own run around it (prologue and
epilogue, not kept in the notebook):

- the prologue cuts the preset's step counts in the kernel (``live_memory.cap_steps``: ``steps``,
  ``warmup``, ``inference_steps`` and the transformer's ``steps`` and ``warmup``; the sizes stay)
  and starts ``live_memory.LiveTensorMemory``, which counts tensor storage with PyTorch's own
  profiler memory events (that module says how, and why not a ``TorchDispatchMode``);
- the epilogue stops it and prints the peak, the bytes still live and the kernel's peak RSS.

Memory per step does not depend on the number of steps once the optimizer state exists, so a few
steps give the peak of the whole run. A loop whose step count is the lesson's own constant (lesson
02's 28 scaler steps, 09's 8) is not cut; where its steps are too slow on a CPU (float16 at a GPU's
width), ``--interrupt-after SECONDS`` interrupts each cell that runs longer, reports it as raised
and goes on: choose SECONDS so that a few steps have run.

A cell that raises does not stop the measurement (a few steps are too few for some accuracy
asserts): every cell runs, and the report names each one that raised, with the error; a later cell
that uses a failed cell's variables raises too (a ``NameError``), and is reported the same way. The
kernel runs with ``AMP_TUTORIAL_DEVICE=cpu`` and no visible CUDA device, so the figures are the same
on any machine, and with ``AMP_TUTORIAL_GPU_SIZES=1``: where a lesson sizes its network by the
device (``amp_tutorial.presets.fp16_width``: lessons 02, 09 and 10 train their float16 network 16
channels wide on a CPU), the CPU runs the width a GPU's run uses, so the figure is a GPU's.

What a CPU run cannot see (say it wherever the figures are used): the CUDA/ROCm context, cuDNN,
cuBLAS and MIOpen workspaces, the caching allocator's rounding and fragmentation, and what a GPU
kernel choice allocates that the CPU's does not (SDPA's kernels differ). ``pdm run handout`` on a
GPU records each lesson's real ``max_memory_allocated`` in ``timings.json``.

A lesson that runs ``scripts/train_ddp.py`` under ``torchrun`` (lesson 11) is measured twice: its
kernel, and one training process of that script at the preset, ``DDP_PROCESSES`` processes under
``torchrun`` on the CPU (Gloo), each counted with the same tracker
(``python -m course_tools.memory ddp-process OUT SCRIPT ARGS...`` is what each process runs).

``--record`` writes the peaks, in MiB, into the lessons' headers through ``course_tools.catalogue``
(``memory: {paper: N}``, and ``process_memory`` for the DDP process); ``--json`` writes the full
report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tqdm.auto import tqdm

from amp_tutorial.presets import GPU_SIZES_ENV, PRESETS
from course_tools.catalogue import (
    Lesson,
    add_lesson_arguments,
    find_lessons,
    notebooks_dir,
    record_memory,
    select_lessons,
)
from course_tools.handout import describe_cell, kernel_env, read_with_answers, run_notebook
from course_tools.live_memory import LiveTensorMemory, read_result

DEFAULT_PRESET = "paper"
CELL_TIMEOUT_S = 3600  # paper sizes on a CPU: lesson 14 compiles the transformer in one cell
MIB = 2**20
DDP_SCRIPT = "train_ddp.py"  # a lesson naming it runs it under torchrun
DDP_PROCESSES = 2  # as lesson 11 starts it
DDP_WORKER = "ddp-process"  # the subcommand each torchrun process runs
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@dataclass(frozen=True)
class StepCaps:
    """The step counts a measurement runs: enough for the optimizer state and a timed step."""

    steps: int = 3
    warmup: int = 1
    inference_steps: int = 2
    transformer_steps: int = 2
    transformer_warmup: int = 1


# Lessons whose asserts need more training steps than StepCaps.steps and get them cheaply, by
# file stem: the memory per step is the same, and the measurement then runs every cell cleanly.
ASSERT_STEPS = {
    "05_amp_recipes": 8,  # HALF = steps // 2 must reach the scaler's growth_interval, 3 (grid 128)
}


@dataclass
class LessonMemory:
    """One lesson's measurement: bytes, where it ran, and each cell that raised."""

    lesson: str
    preset: str
    peak_bytes: int | None  # None: the kernel died before the epilogue
    live_bytes: int | None  # still allocated at the end
    max_rss_bytes: int | None  # the kernel's peak resident memory, for the RAM check
    allocations: int | None
    profiled_by_lesson: int | None  # the lesson's own profiler sessions, folded in
    seconds: float
    steps: int  # the training steps each run took (StepCaps.steps or ASSERT_STEPS)
    raised: list[dict[str, str]] = field(default_factory=list)  # {"cell": ..., "error": ...}
    ddp_process_peak_bytes: int | None = None  # each torchrun process of scripts/train_ddp.py

    @property
    def peak_mib(self) -> int | None:
        return mib(self.peak_bytes)

    @property
    def ddp_process_peak_mib(self) -> int | None:
        return mib(self.ddp_process_peak_bytes)


def mib(nbytes: int | None) -> int | None:
    """Bytes as whole MiB, rounded up (a figure to plan with)."""
    return None if nbytes is None else math.ceil(nbytes / MIB)


def prologue(preset: str, caps: StepCaps) -> str:
    return (
        "from course_tools.live_memory import LiveTensorMemory as _CourseLiveMemory\n"
        "from course_tools.live_memory import cap_steps as _course_cap_steps\n"
        f"_course_cap_steps({preset!r}, steps={caps.steps}, warmup={caps.warmup}, "
        f"inference_steps={caps.inference_steps}, transformer_steps={caps.transformer_steps}, "
        f"transformer_warmup={caps.transformer_warmup})\n"
        "_course_live_memory = _CourseLiveMemory().start()\n")


EPILOGUE = ("_course_live_memory.stop()\n"
            "from course_tools.live_memory import print_result as _course_print\n"
            "_course_print(_course_live_memory.result())\n")


ON_CPU_AT_GPU_SIZES = {"AMP_TUTORIAL_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "",
                      "HIP_VISIBLE_DEVICES": "", GPU_SIZES_ENV: "1"}


def measure_lesson(lesson: Lesson, preset: str = DEFAULT_PRESET, caps: StepCaps = StepCaps(),
                   timeout: int = CELL_TIMEOUT_S, interrupt: bool = False) -> LessonMemory:
    """Run the lesson on the CPU at ``preset`` with the steps cut; its peak live tensor memory.
    ``interrupt``: a cell that runs past ``timeout`` is interrupted, and the run goes on."""
    notebook, _ = read_with_answers(lesson)
    with kernel_env(preset) as env:  # the handout's, on the CPU whatever this machine has
        run = run_notebook(notebook, lesson.path.parent, env | ON_CPU_AT_GPU_SIZES, timeout,
                           lesson.name, stop_at_error=False, prologue=prologue(preset, caps),
                           epilogue=EPILOGUE, interrupt_on_timeout=interrupt)
    result = read_result(run.epilogue or "") or {}
    raised = [{"cell": describe_cell(notebook, error.index), "error": error.what}
              for error in run.errors]
    measured = LessonMemory(
        lesson.name, preset, result.get("peak_bytes"), result.get("live_bytes"),
        result.get("max_rss_bytes"), result.get("allocations"), result.get("profiled_by_lesson"),
        run.seconds, caps.steps, raised)
    if DDP_SCRIPT in lesson.path.read_text(encoding="utf-8"):
        measured.ddp_process_peak_bytes = ddp_process_peak(preset)
    return measured


def ddp_process_peak(preset: str, processes: int = DDP_PROCESSES,
                     timeout: int = CELL_TIMEOUT_S) -> int:
    """The largest peak of live tensor memory of one ``scripts/train_ddp.py`` process, with
    ``processes`` of them under torchrun on the CPU (Gloo), one epoch at ``preset``."""
    with tempfile.TemporaryDirectory(prefix="amp_memory_ddp_") as out:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(processes), "-m", "course_tools.memory", DDP_WORKER,
                   out, str(SCRIPTS / DDP_SCRIPT), "--preset", preset, "--device", "cpu",
                   "--epochs", "1"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        peaks = [json.loads(path.read_text())["peak_bytes"]
                 for path in sorted(Path(out).glob("rank*.json"))]
        if proc.returncode != 0 or len(peaks) != processes:
            raise RuntimeError(f"the DDP measurement failed (exit {proc.returncode}, "
                               f"{len(peaks)} of {processes} results):\n{proc.stdout[-2000:]}"
                               f"\n{proc.stderr[-4000:]}")
        return max(peaks)


def ddp_process(argv: Sequence[str]) -> int:
    """One torchrun process: ``OUT SCRIPT ARGS...``. Runs ``main(ARGS)`` of the script file
    under the tracker and writes ``OUT/rank<RANK>.json``. The file is run, not imported as a
    module of the course: its ``if __name__ == "__main__"`` block (an ``os._exit``) is skipped so
    that the result can be written."""
    out, script, *args = argv
    program = runpy.run_path(script, run_name=Path(script).stem)
    tracker = LiveTensorMemory().start()
    try:
        program["main"](list(args))
    finally:
        tracker.stop()
        rank = os.environ.get("RANK", "0")
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(tracker.result()))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as the script itself leaves: Gloo can abort in interpreter teardown


def describe(result: LessonMemory) -> str:
    """One lesson's line (and its raised cells) for the terminal."""
    if result.peak_bytes is None:
        line = f"{result.lesson}: not measured (the kernel died)"
    else:
        line = (f"{result.lesson}: peak {result.peak_mib} MiB of live tensors at "
                f"{result.preset!r}, {mib(result.live_bytes)} MiB left at the end, kernel RSS "
                f"peak {mib(result.max_rss_bytes)} MiB, {result.seconds:.0f} s")
    if result.ddp_process_peak_bytes is not None:
        line += (f"; each of {DDP_PROCESSES} DDP processes of scripts/{DDP_SCRIPT}: "
                 f"{result.ddp_process_peak_mib} MiB")
    for raised in result.raised:
        line += f"\n    raised in {raised['cell']}: {raised['error'][:300]}"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [DDP_WORKER]:
        return ddp_process(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m course_tools.memory",
        description="Peak live tensor memory of each lesson at a preset, measured on the CPU.")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=list(PRESETS),
                        help=f"problem sizes (default {DEFAULT_PRESET}, a GPU's)")
    add_lesson_arguments(parser)
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per run (default {StepCaps.steps}, or more where a "
                             "lesson's asserts need them: ASSERT_STEPS)")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S,
                        help=f"seconds one cell may run (default {CELL_TIMEOUT_S})")
    parser.add_argument("--interrupt-after", type=int, metavar="SECONDS",
                        help="interrupt a cell that runs longer, report it as raised and go on: "
                             "for loops whose step count is the lesson's own, not the preset's "
                             "(StepCaps cannot cut them), once their first steps have run")
    parser.add_argument("--record", action="store_true",
                        help="write each peak (MiB) into the lesson's header")
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    lessons = find_lessons(args.notebooks or notebooks_dir())
    chosen = select_lessons(lessons, args.lessons) if args.lessons else lessons
    caps = StepCaps() if args.steps is None else StepCaps(steps=args.steps)
    start = time.perf_counter()
    results = []
    for lesson in tqdm(chosen, desc=f"memory ({args.preset})", unit="lesson"):
        steps = ASSERT_STEPS.get(lesson.name, caps.steps) if args.steps is None else args.steps
        result = measure_lesson(lesson, args.preset, replace(caps, steps=steps),
                                args.interrupt_after or args.timeout,
                                interrupt=args.interrupt_after is not None)
        results.append(result)
        tqdm.write(describe(result))
        if args.record and result.peak_bytes is not None:
            record_memory(lesson.path, args.preset, result.peak_mib)
            if result.ddp_process_peak_bytes is not None:
                record_memory(lesson.path, args.preset, result.ddp_process_peak_mib,
                              key="process_memory")
    seconds = time.perf_counter() - start
    print(f"{len(results)} lessons at {args.preset!r} in {seconds / 60:.1f} min")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"preset": args.preset, "caps": asdict(caps), "seconds": round(seconds, 1),
             "lessons": [asdict(r) for r in results]}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
