"""The recorded answers shown beside a learner's own: from machines like theirs, named."""

from amp_tutorial.device import select_device
from amp_tutorial.recorded import RECORDED, recorded_answers


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
