"""The recorded answers shown beside a learner's own: from machines like theirs, named."""

import torch

from amp_tutorial.device import select_device
from amp_tutorial.recorded import RECORDED, recorded_answers, with_recorded


def test_a_cpu_gets_the_answers_of_cpus_with_its_kind_of_bf16():
    info = select_device("cpu")
    for question in ("03 train bf16", "04 infer bf16"):
        answers = recorded_answers(question, info)
        assert answers and {a.device_type for a in answers} == {"cpu"}
        kinds = {a.native_bf16 for a in RECORDED if a.question == question}
        if info.native_bf16 in kinds:  # where one of its kind was recorded, only those
            assert {a.native_bf16 for a in answers} == {info.native_bf16}


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
