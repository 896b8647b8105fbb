"""The quiz: the key marks right, wrong and missing answers, and the solution answers all pass."""

import runpy

import torch

from amp_tutorial.quiz import QUESTIONS, check_quiz, quiz_markdown
from tests.support import SOLUTIONS

SOLUTION = SOLUTIONS / "quiz_answers.py"


def test_solution_answers_are_all_correct() -> None:
    result = check_quiz(runpy.run_path(str(SOLUTION))["answers"])
    assert result.all_correct and result.score == len(QUESTIONS)


def test_wrong_missing_and_invalid_answers_are_marked() -> None:
    wrong = next(letter for letter in QUESTIONS[1].options if letter != QUESTIONS[1].answer)
    result = check_quiz({1: wrong, 2: "z", 3: QUESTIONS[3].answer.upper()})
    assert result.marks[1] == "wrong" and result.marks[2] == "wrong"
    assert result.marks[3] == "correct"  # case and spaces do not matter
    assert result.marks[4] == "unanswered" and not result.all_correct
    assert QUESTIONS[1].why not in str(result)  # a wrong answer does not give the reason away


def test_every_question_is_shown_with_its_options() -> None:
    text = quiz_markdown()
    for q in QUESTIONS.values():
        assert q.answer in q.options and q.text in text
        assert all(option in text for option in q.options.values())


def test_clipping_answer_depends_on_the_optimizer() -> None:
    """The clipping question is about Adam: the SGD-only answer (steps shrink by the scale) is an
    option, and it is marked wrong; the right one names the threshold acting at max_norm / scale."""
    q = QUESTIONS[4]
    assert "Adam" in q.text
    sgd_only = next(k for k, text in q.options.items() if "divided by the scale" in text)
    assert check_quiz({4: sgd_only}).marks[4] == "wrong"
    assert "max_norm / scale" in q.options[q.answer] and "SGD" in q.why


def test_bfloat16_range_facts() -> None:
    """Question 2: bf16 shares fp32's smallest normal (2**-126) and about its largest value;
    only its subnormals stop sooner (2**-133 against 2**-149)."""
    bf16, fp32, fp16 = (torch.finfo(d) for d in (torch.bfloat16, torch.float32, torch.float16))
    assert "2**-126" in QUESTIONS[2].options[QUESTIONS[2].answer]
    assert bf16.smallest_normal == fp32.smallest_normal == 2.0**-126
    assert round(bf16.max, -37) == round(fp32.max, -37) == 3.4e38 and bf16.max < fp32.max
    assert torch.tensor(2.0**-133, dtype=torch.bfloat16).item() == 2.0**-133  # smallest subnormal
    assert torch.tensor(2.0**-134, dtype=torch.bfloat16).item() == 0.0  # half of it: ties to 0
    assert torch.tensor(2.0**-149, dtype=torch.float32).item() == 2.0**-149
    assert fp16.smallest_normal == 2.0**-14  # fp16 rounds to zero at and below 2**-25 (3e-8)
    assert torch.tensor(2.0**-25, dtype=torch.float16) == 0
    assert torch.tensor(2.0**-25, dtype=torch.bfloat16) == 2.0**-25  # a normal bf16 number
