"""The recorded answers shown beside a learner's own: from machines like theirs, named."""

import torch

from amp_tutorial.device import select_device
from amp_tutorial.recorded import RECORDED, recorded_answers, with_recorded


def test_a_cpu_gets_the_answers_of_cpus_with_its_kind_of_bf16():
    """An emulated bf16 step runs several times slower than fp32 where a native one runs faster:
    lesson 17 on the Zen 3 beside CPU hogs printed a Zen 4's 1.66x and a Xeon's 2.49x beside its
    own 0.14x. A CPU gets only answers of its own kind, or none."""
    from amp_tutorial.device import DeviceInfo

    for native in (True, False, None):
        info = DeviceInfo(torch.device("cpu"), "cpu", "test", native_bf16=native)
        for question in {a.question for a in RECORDED}:
            answers = recorded_answers(question, info)
            assert {a.native_bf16 for a in answers} <= {native}, (native, question)
            kinds = {(a.device_type, a.native_bf16) for a in RECORDED if a.question == question}
            assert bool(answers) == (("cpu", native) in kinds), (native, question)
    for question in ("03 train bf16", "04 infer bf16", "12 train bf16", "17 bf16"):
        assert recorded_answers(question, select_device("cpu"))  # recorded for both kinds


def test_every_answer_names_its_machine_date_preset_and_method():
    for answer in RECORDED:
        said = str(answer)
        for part in (answer.machine, answer.date, answer.preset, answer.torch, answer.method):
            assert part and part in said
        assert answer.answer[0].isdigit() and "x" in answer.answer
        assert (answer.native_bf16 is None) == (answer.device_type != "cpu")


def test_the_recorded_answers_follow_only_a_comparison_that_states_no_ratio():
    from amp_tutorial.interleave import PairedComparison, Ratio

    info = select_device("cpu")
    quiet = PairedComparison("AMP bf16", "fp32", Ratio(0.5, 0.45, 0.55, 5),
                             Ratio(1.0, 0.98, 1.02, 5), "wall time", "small")
    wide = PairedComparison("AMP bf16", "fp32", Ratio(0.5, 0.2, 0.9, 5),
                            Ratio(1.0, 0.98, 1.02, 5), "wall time", "small")
    assert with_recorded(quiet, "03 train bf16", info) == str(quiet)
    lines = with_recorded(wide, "03 train bf16", info).splitlines()
    assert lines[0] == str(wide) and len(lines) == 1 + len(recorded_answers("03 train bf16", info))
    assert all(line.startswith("    recorded: ") for line in lines[1:]) and lines[1:]


def test_the_ladder_s_questions_are_the_rung_names_lesson_17_asks():
    """Lesson 17 asks "17 <rung name without 'AMP '>": a recorded key that no rung name gives
    would never be shown."""
    from amp_tutorial.device import DeviceInfo
    from amp_tutorial.ladder import ladder_rungs

    asked = set()
    for amp in (torch.bfloat16, torch.float16):
        info = DeviceInfo(torch.device("cpu"), "cpu", "test", amp_dtypes=(amp,))
        asked |= {f"17 {r.name.removeprefix('AMP ')}" for r, _ in ladder_rungs(info)}
    assert {a.question for a in RECORDED if a.question.startswith("17 ")} <= asked
