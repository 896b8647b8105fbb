"""``pdm run ladder``: the course's transformer from fp32 toward the hardware's limit, in MFU.

Three parts (``--parts``), on any device:

- **ladder**: fp32, AMP, + fused AdamW, + torch.compile, + CUDA graphs, + a larger batch, the
  other 16-bit dtype and pure bf16 (``amp_tutorial.ladder``), each row with its model FLOPs per
  step (``FlopCounterMode``), achieved TFLOP/s, MFU against the GPU's datasheet peak where the
  course knows it (``amp_tutorial.mfu.PEAKS``), and its share of the measured matmul rate;
- **profile**: each rung's step split into matmuls, attention, memory-bound ops, the optimizer
  and idle time (``amp_tutorial.step_profile``); runs with the ladder;
- **sweep**: fp32 and AMP over the transformer's width and tokens per step, and from which width
  AMP pays on this device.

``--budget S`` stops starting new runs after S seconds (the rows left say "not reached"), so the
whole command fits a lent GPU's time; ``--json`` and ``--plots`` write what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from amp_tutorial.ceiling import SIZES, matmul_ceiling
from amp_tutorial.device import DeviceNotAvailableError, cpu_bf16_flags, select_device
from amp_tutorial.ladder import (
    MFU_GOAL,
    RungResult,
    SweepRow,
    amp_pays_from,
    ladder_figures,
    ladder_report,
    run_ladder,
    sweep,
    sweep_widths,
    with_width,
)
from amp_tutorial.mfu import peak_for, percent
from amp_tutorial.presets import UnknownPresetError, get_preset

PARTS = ("ladder", "sweep")


def table(cols: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
             for r in [cols, *rows]]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


LADDER_COLUMNS = ["rung", "what it changed", "tokens/step", "ms/step (IQR)", "TFLOP/s", "MFU",
                  "of matmul", "final loss"]


def rung_line(row: RungResult) -> list[str]:
    """One table row, in LADDER_COLUMNS' order."""
    values = row.table_row()
    return [str(values.get(c, "")) for c in LADDER_COLUMNS]


def shares_table(rows: list[RungResult]) -> str:
    from amp_tutorial.step_profile import GROUPS

    def its_matmuls(r: RungResult) -> str:
        if r.matmul_tflops is None:
            return "n/a"
        return f"{r.matmul_tflops:.3g}" + (f" ({r.matmul_of_rate:.0%})" if r.matmul_of_rate else "")

    measured = [r for r in rows if r.shares is not None]
    return table(["rung", *GROUPS, "from", "its matmuls: TFLOP/s (of the rate)"],
                 [[r.rung.name, *(f"{r.shares.shares[g]:.0%}" for g in GROUPS),
                   r.shares.source, its_matmuls(r)] for r in measured])


def sweep_table(rows: list[SweepRow]) -> str:
    out = []
    for r in rows:
        res = r.result
        if res.timing is None or res.utilization is None:
            out.append([str(r.d_model), str(r.tokens), r.mode, res.skipped or "-", "", "", ""])
            continue
        out.append([str(r.d_model), str(r.tokens), r.mode,
                    f"{res.timing.median * 1e3:.2f} ({res.timing.iqr * 1e3:.2f})",
                    f"{res.utilization.tflops:.3g}", percent(res.utilization.mfu),
                    percent(res.utilization.of_matmul)])
    return table(["width", "tokens/step", "mode", "ms/step (IQR)", "TFLOP/s", "MFU",
                  "of matmul"], out)


def write_plots(folder: Path, report: dict) -> list[Path]:
    """The ladder's, the time shares' and the sweep's figures from a report, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in ladder_figures(report).items():
        written.append(folder / f"{name}.png")
        fig.savefig(written[-1], dpi=110)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdm run ladder", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", help="paper, cpu, small, smoke or auto (default: "
                        "$AMP_TUTORIAL_PRESET or auto)")
    parser.add_argument("--device", help="cuda, cpu, ... (default: the best available)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--width", type=int, help="the ladder's model width (a multiple of "
                        "64, heads of 64 channels; default: the preset's)")
    parser.add_argument("--widths", nargs="+", type=int, help="the sweep's widths (default: "
                        "from a quarter to four times the preset's)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no new run starts (the ladder gets 60%%)")
    parser.add_argument("--run-budget", type=float, default=3.0,
                        help="seconds of timed steps per run (at least 3 steps)")
    parser.add_argument("--max-steps", type=int, default=30, help="timed steps per run, at most")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--plots", metavar="DIR", type=Path, help="write the figures to DIR")
    parser.add_argument("--replot", metavar="JSON", type=Path,
                        help="draw the figures of a report written before (with --plots)")
    args = parser.parse_args(argv)
    if args.replot:
        report = json.loads(args.replot.read_text(encoding="utf-8"))
        for path in write_plots(args.plots or args.replot.parent, report):
            print(f"figure written to {path}")
        return 0
    started = time.monotonic()
    try:
        info = select_device(args.device)
        preset = get_preset(args.preset, info.type)
    except (DeviceNotAvailableError, UnknownPresetError) as err:
        parser.exit(2, f"error: {err}\n")
    sizes = preset.transformer
    if args.width is not None:
        try:
            sizes = with_width(sizes, args.width)
        except ValueError as err:
            parser.exit(2, f"error: {err}\n")
    peak = peak_for(info.name, info.type)
    flags = cpu_bf16_flags() if info.type == "cpu" else None
    print(f"device: {info}" + (f"; CPU bf16 flags: {', '.join(flags) or 'none'}"
                               if flags is not None else ""))
    print(f"torch {torch.__version__}; preset {preset.name}: transformer {sizes.n_layers} layers, "
          f"width {sizes.d_model}, {sizes.n_heads} heads, seq {sizes.seq_len}, batch "
          f"{sizes.batch}")
    print("peak: " + (f"{peak.name}, dense TFLOP/s " + ", ".join(
        f"{k} {v:g}" for k, v in peak.tflops.items()) + f" ({peak.source})" if peak else
        "no datasheet peak for this device; MFU is n/a, 'of matmul' is the measure"), flush=True)
    ceiling = matmul_ceiling(info, SIZES[preset.name], "matmuls")
    print("\n".join(ceiling.lines()), flush=True)
    options = {"budget_s": args.run_budget, "max_steps": args.max_steps}
    report = ladder_report(info, ceiling) | {"preset": preset.name, "cpu_bf16_flags": flags,
                                             "width": sizes.d_model, "heads": sizes.n_heads}
    ladder_rows: list[RungResult] = []
    sweep_rows: list[SweepRow] = []
    if "ladder" in args.parts:
        deadline = None if args.budget is None else started + 0.6 * args.budget
        print("\nThe ladder (MFU: achieved / datasheet peak of the dtype it computes in, so an "
              "fp32 rung's is against fp32's or TF32's lower peak: compare rungs by time or "
              "TFLOP/s; of matmul: achieved / the measured matmul rate of that dtype)", flush=True)
        ladder_rows = run_ladder(info, sizes, ceiling, deadline, preset=preset.name,
                                 on_row=lambda r: print(
            "  " + " | ".join(v for v in rung_line(r) if v), flush=True), **options)
        print(table(LADDER_COLUMNS, [rung_line(r) for r in ladder_rows]))
        compared = [r.comparison for r in ladder_rows if r.comparison is not None]
        if compared:  # the eager rungs again, taking turns with fp32: a load meets them alike
            print("\nThe eager rungs against fp32, from steps that took turns:")
            print("\n".join(f"  {c}" for c in compared))
        print("\nWhere the time goes (share of each step)")
        print(shares_table(ladder_rows))
        if peak is not None:
            best = max((r for r in ladder_rows if r.utilization),
                       key=lambda r: r.utilization.tflops, default=None)
            if best is not None:
                verdict = "reached" if best.utilization.mfu >= MFU_GOAL else "not reached"
                print(f"\nbest rung: {best.rung.name}, MFU {percent(best.utilization.mfu)}: the "
                      f"{MFU_GOAL:.0%} goal {verdict}")
        report |= ladder_report(info, ceiling, ladder_rows)
    if "sweep" in args.parts:
        deadline = None if args.budget is None else started + args.budget
        widths = tuple(args.widths or sweep_widths(preset.name))
        print(f"\nThe sweep: widths {', '.join(map(str, widths))} (heads of 64 channels), "
              "fp32 and plain AMP, eager", flush=True)
        sweep_rows = sweep(info, sizes, ceiling, widths, deadline=deadline, **options)
        print(sweep_table(sweep_rows))
        pays = {t: amp_pays_from(sweep_rows, t) for t in sorted({r.tokens for r in sweep_rows})}
        for tokens, width in pays.items():
            print(f"AMP faster than fp32 at {tokens} tokens per step: "
                  + (f"from width {width} up" if width else "at no width measured"))
        report |= ladder_report(info, ceiling, (), sweep_rows)
    report["seconds"] = round(time.monotonic() - started, 1)
    if args.plots:
        for path in write_plots(args.plots, report):
            print(f"figure written to {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
        print(f"JSON written to {args.json}")
    print(f"{report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
