"""The quiz: the key marks right, wrong and missing answers, the solution answers all pass, every
lesson 07-17 has a question, lesson 06 offers a blank per question, and the facts the keyed
answers state hold for the installed torch (on this CPU, and on CUDA through fake tensors)."""

import ast
import runpy
import warnings
from collections import Counter

import jupytext
import pytest
import torch
import torch.nn.functional as F

from amp_tutorial.autocast_policy import (
    BANNED,
    FP32,
    FP32_OUT,
    LOWERED,
    NO_RULE,
    autocast_policy,
    header_rules,
)
from amp_tutorial.quiz import QUESTIONS, Question, check_quiz, quiz_markdown
from course_tools.answers import is_exercise
from course_tools.catalogue import lesson_paths
from tests.support import NOTEBOOKS, SOLUTIONS

SOLUTION = SOLUTIONS / "quiz_answers.py"
QUIZ_LESSON = NOTEBOOKS / "06_exercise_train_with_amp.py"


def about(lesson: str) -> Question:
    """The question on ``lesson`` ("07"), for the fact checks below."""
    (question,) = (q for q in QUESTIONS.values() if q.lesson == lesson)
    return question


def test_solution_answers_are_all_correct() -> None:
    result = check_quiz(runpy.run_path(str(SOLUTION))["answers"])
    assert result.all_correct and result.score == len(QUESTIONS)
    assert all(q.why in str(result) for q in QUESTIONS.values())  # a right answer says why


def test_wrong_missing_and_invalid_answers_are_marked() -> None:
    wrong = next(letter for letter in QUESTIONS[1].options if letter != QUESTIONS[1].answer)
    result = check_quiz({1: wrong, 2: "z", 3: QUESTIONS[3].answer.upper()})
    assert result.marks[1] == "wrong" and result.marks[2] == "wrong"
    assert result.marks[3] == "correct"  # case and spaces do not matter
    assert result.marks[4] == "unanswered" and not result.all_correct
    assert QUESTIONS[1].why not in str(result)  # a wrong answer does not give the reason away


@pytest.mark.parametrize("answers", [["b", "b", "a"], "bbacca", None, 3, ("b", "b")],
                         ids=["list", "str", "None", "int", "tuple"])
def test_answers_that_are_not_a_dict_get_one_plain_line(answers: object) -> None:
    result = check_quiz(answers)
    text = str(result)
    assert not result.all_correct and result.score == 0
    assert set(result.marks.values()) == {"unanswered"} and len(result.marks) == len(QUESTIONS)
    assert len(result.lines) == 1 and "not a dict" in text and "answers = {1:" in text
    assert "Traceback" not in text


def test_question_numbers_written_as_strings_are_read() -> None:
    result = check_quiz({str(n): q.answer for n, q in QUESTIONS.items()})
    assert result.all_correct


@pytest.mark.parametrize("number", list(QUESTIONS))
def test_every_wrong_option_is_marked_wrong_and_the_reason_withheld(number: int) -> None:
    q = QUESTIONS[number]
    for letter in set(q.options) - {q.answer}:
        result = check_quiz({number: letter})
        assert result.marks[number] == "wrong", letter
        assert q.why not in str(result) and q.options[q.answer] not in str(result), letter


def test_every_question_is_shown_with_its_options_and_lesson() -> None:
    text = quiz_markdown()
    for q in QUESTIONS.values():
        assert q.answer in q.options and q.text in text and f"(lesson {q.lesson})" in text
        assert all(option in text for option in q.options.values())


def test_every_lesson_07_to_17_has_a_question_and_every_lesson_named_exists() -> None:
    lessons = {path.name[:2] for path in lesson_paths(NOTEBOOKS)}
    named = {q.lesson for q in QUESTIONS.values()}
    assert named <= lessons, f"questions name lessons with no file in notebooks/: {named - lessons}"
    later = {f"{n:02d}" for n in range(7, 18)}
    assert later <= named, f"lessons without a question: {sorted(later - named)}"


def test_the_key_is_not_one_letter() -> None:
    """Guessing one letter for everything must not pass half the quiz."""
    assert max(Counter(q.answer for q in QUESTIONS.values()).values()) <= len(QUESTIONS) // 2


def test_lesson_06_offers_a_blank_per_question_and_states_the_count() -> None:
    notebook = jupytext.read(QUIZ_LESSON)
    (stub,) = (c for c in notebook.cells
               if is_exercise(c) and c.metadata.get("solution") == SOLUTION.name)
    assert ast.literal_eval(stub.source.split("answers = ", 1)[1]) == dict.fromkeys(QUESTIONS)
    prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    assert f"The quiz has {len(QUESTIONS)} questions" in prose


def test_clipping_answer_depends_on_the_optimizer() -> None:
    """The clipping question is about Adam: the SGD-only answer (steps shrink by the scale) is an
    option, and it is marked wrong; the right one names the threshold acting at max_norm / scale."""
    q = QUESTIONS[4]
    assert "Adam" in q.text
    sgd_only = next(k for k, text in q.options.items() if "divided by the scale" in text)
    assert check_quiz({4: sgd_only}).marks[4] == "wrong"
    assert "max_norm / scale" in q.options[q.answer] and "SGD" in q.why


# -- the facts the keyed answers state, on the installed torch -------------------------------------
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


def test_number_format_facts() -> None:
    """Lessons 13, 15 and 16: -1e9 in float16, a bf16 update that rounds away, e4m3's range."""
    scores = torch.zeros(3, dtype=torch.float16)
    overflow = "cannot be converted to type c10::Half without overflow"
    with pytest.raises(RuntimeError, match=overflow):
        scores.masked_fill(torch.tensor([True, False, True]), -1e9)
    assert torch.tensor(-1e9).half().isinf() and torch.tensor(-1e9).bfloat16().isfinite()
    assert "RuntimeError" in about("13").options[about("13").answer]

    one = torch.tensor(1.0, dtype=torch.bfloat16)
    assert one - 1e-3 == one and torch.nextafter(one, torch.zeros_like(one)) == 1 - 2.0**-8

    e4m3, e5m2 = torch.finfo(torch.float8_e4m3fn), torch.finfo(torch.float8_e5m2)
    assert (e4m3.smallest_normal, e4m3.max, e4m3.eps) == (2.0**-6, 448, 2.0**-3)  # 3 mantissa bits
    assert (e5m2.smallest_normal, e5m2.max, e5m2.eps) == (2.0**-14, 57344, 2.0**-2)
    assert torch.tensor([2.0**-10]).to(torch.float8_e4m3fn).float().item() == 0.0
    assert "2**-6 to 448" in about("16").options[about("16").answer]


def test_autocast_facts() -> None:
    """Lessons 07 and 12 on CUDA (fake tensors through the real dispatcher) and on the CPU, and
    lesson 10's `out=` on the CPU."""
    cuda = {r.op: r.verdict for r in autocast_policy("cuda", torch.float16, n=2)}
    cpu = {r.op: r.verdict for r in autocast_policy("cpu", torch.bfloat16, n=2)}
    assert cuda["binary_cross_entropy"] == BANNED and cpu["binary_cross_entropy"] == FP32
    assert (cuda["linear"], cuda["layer_norm"], cuda["softmax"]) == (LOWERED, FP32, FP32_OUT)
    assert cpu["layer_norm"] == cpu["softmax"] == NO_RULE
    rules = header_rules()  # the CUDA lists of the installed torch's autocast_mode.h
    if rules is not None:
        assert rules["scaled_dot_product_attention"] == LOWERED
        assert rules["binary_cross_entropy_with_logits"] == FP32

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.mm(a, b, out=torch.empty(8, 8))
        bce = F.binary_cross_entropy_with_logits(a.bfloat16(), b.sigmoid().bfloat16())
    assert out.dtype == torch.float32 and torch.equal(out, a @ b)
    assert bce.dtype == torch.float32  # bf16 logits, fp32 loss: CPU autocast's fp32 list


@pytest.mark.skipif(torch.cuda.is_available(), reason="the question is about a CUDA-less machine")
def test_hard_coded_cuda_switches_itself_off() -> None:
    """Lesson 08: without CUDA, GradScaler("cuda") and autocast("cuda") warn and turn off."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda"):
            autocast_on = torch.is_autocast_enabled("cuda")
    assert not scaler.is_enabled() and not autocast_on
    assert sum("Disabling" in str(w.message) for w in caught) == 2
