"""The two quizzes: no quiz asks about a later lesson, each question's section exists in its
lesson, the keys mark right, wrong and missing answers in the common spellings, a wrong answer
names where to reread without giving the letter away, the solution answers all pass, each lesson
offers a blank per question, and the facts the keyed answers state hold for the installed torch
(on this CPU, and on CUDA through fake tensors)."""

import ast
import re
import runpy
import warnings
from collections import Counter
from pathlib import Path
from unittest import mock

import jupytext
import pytest
import torch
import torch.nn.functional as F

from amp_tutorial import quiz as quiz_module
from amp_tutorial.autocast_policy import (
    BANNED,
    FP32,
    FP32_OUT,
    LOWERED,
    NO_RULE,
    autocast_policy,
    header_rules,
)
from amp_tutorial.data import make_problem
from amp_tutorial.measure import StepTimer, activation_output_bytes, saved_bytes
from amp_tutorial.models import ConvModel
from amp_tutorial.quiz import (
    ADVANCED_QUESTIONS,
    ADVANCED_QUIZ,
    CORE_QUESTIONS,
    CORE_QUIZ,
    QUIZZES,
    Question,
    Quiz,
    read_letter,
)
from course_tools.answers import is_exercise
from course_tools.catalogue import lesson_paths
from tests.support import NOTEBOOKS, SOLUTIONS

SOLUTION = {"06": SOLUTIONS / "quiz_answers.py", "17": SOLUTIONS / "quiz_advanced_answers.py"}
HEADING = re.compile(r"^#{2,3} (.+?)\s*$", re.MULTILINE)  # a `## ...` or `### ...` heading
EVERY_QUESTION = [pytest.param(quiz, number, id=f"{quiz.lesson}-q{number}")
                  for quiz in QUIZZES for number in quiz.questions]
BY_QUIZ = pytest.mark.parametrize("quiz", QUIZZES, ids=lambda quiz: f"lesson{quiz.lesson}")


def lesson_file(lesson: str) -> Path:
    """The lesson file whose name starts with ``lesson`` ("07")."""
    (path,) = (p for p in lesson_paths(NOTEBOOKS) if p.name[:2] == lesson)
    return path


def headings(lesson: str) -> set[str]:
    """The text of every ``##`` and ``###`` heading in the lesson's markdown cells."""
    notebook = jupytext.read(lesson_file(lesson))
    return {m.group(1) for cell in notebook.cells if cell.cell_type == "markdown"
            for m in HEADING.finditer(cell.source)}


def about(lesson: str) -> Question:
    """The advanced quiz's question on ``lesson`` ("13"), for the fact checks below."""
    (question,) = (q for q in ADVANCED_QUESTIONS.values() if q.lesson == lesson)
    return question


def wrong_letter(q: Question) -> str:
    return next(letter for letter in q.options if letter != q.answer)


# -- where each quiz is, and what it asks about ----------------------------------------------------
def test_no_quiz_asks_about_a_later_lesson_and_each_track_is_covered() -> None:
    core = {q.lesson for q in CORE_QUESTIONS.values()}
    advanced = {q.lesson for q in ADVANCED_QUESTIONS.values()}
    assert (CORE_QUIZ.lesson, ADVANCED_QUIZ.lesson) == ("06", "17")
    assert core == {"01", "02", "03", "04", "05"}, core  # every core lesson before 06, no later
    assert advanced == {f"{n:02d}" for n in range(7, 18)}, advanced  # one per lesson 07-17
    for quiz in QUIZZES:
        later = [n for n, q in quiz.questions.items() if q.lesson > quiz.lesson]
        assert not later, f"lesson {quiz.lesson}'s quiz asks about later lessons: {later}"
        assert list(quiz.questions) == list(range(1, len(quiz.questions) + 1))


@pytest.mark.parametrize(("quiz", "number"), EVERY_QUESTION)
def test_every_section_to_reread_is_a_heading_of_its_lesson(quiz: Quiz, number: int) -> None:
    q = quiz.questions[number]
    assert q.section in headings(q.lesson), (
        f"lesson {q.lesson} has no `##`/`###` heading {q.section!r}: {sorted(headings(q.lesson))}")


@BY_QUIZ
def test_each_quiz_sits_in_its_lesson_with_a_blank_per_question(quiz: Quiz) -> None:
    notebook = jupytext.read(lesson_file(quiz.lesson))
    solution = SOLUTION[quiz.lesson]
    (stub,) = (c for c in notebook.cells
               if is_exercise(c) and c.metadata.get("solution") == solution.name)
    assert ast.literal_eval(stub.source.split("answers = ", 1)[1]) == dict.fromkeys(quiz.questions)
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    checker = code[code.index(stub.source) + 1]  # the cell after the stub marks it
    name = re.search(r"quiz = (\w+)\.check\(answers\)", checker)
    assert name and getattr(quiz_module, name.group(1)) is quiz, checker  # this lesson's quiz
    assert "assert quiz.all_correct" in checker
    prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    assert f"The quiz has {len(quiz.questions)} questions" in prose
    assert prose.index("## Quiz") < prose.index("## What to remember")


@BY_QUIZ
def test_solution_answers_are_all_correct(quiz: Quiz) -> None:
    result = quiz.check(runpy.run_path(str(SOLUTION[quiz.lesson]))["answers"])
    assert result.all_correct and result.score == len(quiz.questions)
    assert all(q.why in str(result) for q in quiz.questions.values())  # a right answer says why
    other = next(each for each in QUIZZES if each is not quiz)
    assert not other.check(runpy.run_path(str(SOLUTION[quiz.lesson]))["answers"]).all_correct


# -- marking ---------------------------------------------------------------------------------------
def test_wrong_missing_and_invalid_answers_are_marked() -> None:
    q = CORE_QUESTIONS
    result = CORE_QUIZ.check({1: wrong_letter(q[1]), 2: "z", 3: q[3].answer.upper()})
    assert result.marks[1] == "wrong" and result.marks[2] == "wrong"
    assert result.marks[3] == "correct"  # case and spaces do not matter
    assert result.marks[4] == "unanswered" and not result.all_correct
    assert q[1].why not in str(result)  # a wrong answer does not give the reason away
    assert "2. 'z' is not one of a, b, c, d" in result.lines


@pytest.mark.parametrize(("quiz", "number"), EVERY_QUESTION)
def test_a_wrong_answer_names_where_to_reread_and_withholds_the_answer(
        quiz: Quiz, number: int) -> None:
    q = quiz.questions[number]
    for letter in set(q.options) - {q.answer}:
        result = quiz.check({number: letter})
        assert result.marks[number] == "wrong", letter
        (line,) = (line for line in result.lines if line.startswith(f"{number}. "))
        assert f"lesson {q.lesson}" in line and f'"{q.section}"' in line, line
        assert q.why not in line and q.options[q.answer] not in line, letter
        assert f"'{q.answer}'" not in line and f'"{q.answer}"' not in line, line  # no letter



SPELLINGS = {  # how a learner may write the letter x
    "upper": lambda x: x.upper(),
    "spaces": lambda x: f" {x} ",
    "newline": lambda x: f"{x}\n",
    "bracket": lambda x: f"{x})",
    "brackets": lambda x: f"({x})",
    "full-stop": lambda x: f"{x}.",
    "upper-bracket": lambda x: f"{x.upper()})",
    "list": lambda x: [x],
    "tuple": lambda x: (x,),
    "set": lambda x: {x},
    "list-of-spelled": lambda x: [f" ({x.upper()}) "],
}


@pytest.mark.parametrize("spell", SPELLINGS.values(), ids=list(SPELLINGS))
def test_the_common_spellings_of_a_letter_are_read(spell) -> None:
    """"B", " b ", "b)", "(b)", "b.", ["b"], ("b",), {"b"} all mean "b", right or wrong."""
    for quiz in QUIZZES:
        right = quiz.check({n: spell(q.answer) for n, q in quiz.questions.items()})
        assert right.all_correct, str(right)
        wrong = quiz.check({n: spell(wrong_letter(q)) for n, q in quiz.questions.items()})
        assert set(wrong.marks.values()) == {"wrong"}, str(wrong)
        assert all("reread lesson" in line for line in wrong.lines), str(wrong)


@pytest.mark.parametrize(("given", "expected"), [
    (["a", "b"], "one letter was expected, not 2"),
    (("b", "c", "d"), "one letter was expected, not 3"),
    ({"a", "b"}, "one letter was expected, not 2"),
    ("ab", "one letter, such as \"b\", was expected"),
    ("b and c", "one letter, such as \"b\", was expected"),
    (2, "a letter in quotes, such as \"b\", was expected, not 2"),
    ([["b"]], "a letter in quotes"),
    ("e", "'e' is not one of a, b, c, d"),
    ("(z)", "'z' is not one of a, b, c, d"),
])
def test_an_answer_that_is_not_one_known_letter_gets_a_plain_message(
        given: object, expected: str) -> None:
    result = CORE_QUIZ.check({1: given})
    (line,) = (line for line in result.lines if line.startswith("1. "))
    assert result.marks[1] == "wrong" and expected in line, line
    assert "a, b, c" in line and "reread" not in line  # what was expected, not a hint
    assert CORE_QUESTIONS[1].why not in str(result) and "Traceback" not in str(result)


@pytest.mark.parametrize("blank", [None, "", "  ", [], ()], ids=repr)
def test_a_blank_answer_is_unanswered(blank: object) -> None:
    assert read_letter(blank) == (None, None)
    result = ADVANCED_QUIZ.check({1: blank})
    assert result.marks[1] == "unanswered" and "1. not answered yet" in result.lines


@BY_QUIZ
@pytest.mark.parametrize("answers", [["b", "b", "a"], "bbacca", None, 3, ("b", "b")],
                         ids=["list", "str", "None", "int", "tuple"])
def test_answers_that_are_not_a_dict_get_one_plain_line(quiz: Quiz, answers: object) -> None:
    result = quiz.check(answers)
    text = str(result)
    assert not result.all_correct and result.score == 0
    assert set(result.marks.values()) == {"unanswered"} and len(result.marks) == len(quiz.questions)
    assert len(result.lines) == 1 and "not a dict" in text and "answers = {1:" in text
    assert "Traceback" not in text


@BY_QUIZ
def test_question_numbers_written_as_strings_are_read(quiz: Quiz) -> None:
    assert quiz.check({str(n): q.answer for n, q in quiz.questions.items()}).all_correct
    assert quiz.check({f" {n} ": q.answer for n, q in quiz.questions.items()}).all_correct
    # an int key wins over the same number written as a string
    both = {1: quiz.questions[1].answer, "1": wrong_letter(quiz.questions[1])}
    assert quiz.check(both).marks[1] == "correct"


def test_numbers_that_are_not_questions_of_this_quiz_are_named() -> None:
    """Answers meant for the other quiz, or an old numbering, are pointed out, not dropped."""
    n = len(CORE_QUESTIONS)
    result = CORE_QUIZ.check({1: CORE_QUESTIONS[1].answer, n + 1: "a", "q2": "b"})
    assert result.marks[1] == "correct" and len(result.marks) == n
    assert result.lines[-1] == (f"Not questions of this quiz: {n + 1}, 'q2'; it has questions "
                                f"1 to {n}.")
    assert not any("Not questions" in line for line in CORE_QUIZ.check({1: "a"}).lines)


@BY_QUIZ
def test_every_question_is_shown_with_its_options_and_lesson(quiz: Quiz) -> None:
    text = quiz.markdown()
    for number, q in quiz.questions.items():
        assert q.answer in q.options and f"{number}. {q.text} *(lesson {q.lesson})*" in text
        assert all(f"**{letter}**: {option}" in text for letter, option in q.options.items())
    others = [q.text for each in QUIZZES if each is not quiz for q in each.questions.values()]
    assert not any(other in text for other in others)


@BY_QUIZ
def test_the_key_is_not_one_letter(quiz: Quiz) -> None:
    """Guessing one letter for everything must not pass half the quiz."""
    counts = Counter(q.answer for q in quiz.questions.values())
    assert max(counts.values()) <= len(quiz.questions) // 2, counts


def test_clipping_answer_depends_on_the_optimizer() -> None:
    """The clipping question is about Adam: the SGD-only answer (steps shrink by the scale) is an
    option, and it is marked wrong; the right one names the threshold acting at max_norm / scale.
    Lesson 06's "Try it" refers to it as question 4."""
    q = CORE_QUESTIONS[4]
    assert "Adam" in q.text and q.lesson == "02"
    sgd_only = next(k for k, text in q.options.items() if "divided by the scale" in text)
    assert CORE_QUIZ.check({4: sgd_only}).marks[4] == "wrong"
    assert "max_norm / scale" in q.options[q.answer] and "SGD" in q.why
    assert "Quiz question 4 says what this mistake does to SGD and to Adam" in (
        lesson_file("06").read_text())


# -- the facts the keyed answers state, on the installed torch -------------------------------------
def test_bfloat16_range_facts() -> None:
    """Core question 2: bf16 shares fp32's smallest normal (2**-126) and about its largest value;
    only its subnormals stop sooner (2**-133 against 2**-149)."""
    bf16, fp32, fp16 = (torch.finfo(d) for d in (torch.bfloat16, torch.float32, torch.float16))
    assert "2**-126" in CORE_QUESTIONS[2].options[CORE_QUESTIONS[2].answer]
    assert bf16.smallest_normal == fp32.smallest_normal == 2.0**-126
    assert round(bf16.max, -37) == round(fp32.max, -37) == 3.4e38 and bf16.max < fp32.max
    assert torch.tensor(2.0**-133, dtype=torch.bfloat16).item() == 2.0**-133  # smallest subnormal
    assert torch.tensor(2.0**-134, dtype=torch.bfloat16).item() == 0.0  # half of it: ties to 0
    assert torch.tensor(2.0**-149, dtype=torch.float32).item() == 2.0**-149
    assert fp16.smallest_normal == 2.0**-14  # fp16 rounds to zero at and below 2**-25 (3e-8)
    assert torch.tensor(2.0**-25, dtype=torch.float16) == 0
    assert torch.tensor(2.0**-25, dtype=torch.bfloat16) == 2.0**-25  # a normal bf16 number


def test_timing_facts() -> None:
    """Core question 7: StepTimer synchronises before each clock read (two per step) and keeps
    the warm-up steps out of its statistics."""
    assert "queued" in CORE_QUESTIONS[7].options[CORE_QUESTIONS[7].answer]
    synchronised = []
    with mock.patch("amp_tutorial.measure.synchronize", side_effect=synchronised.append):
        timer = StepTimer("cpu", warmup=2)
        for _ in range(5):
            with timer.step():
                pass
    assert len(synchronised) == 2 * 5  # before the clock starts and before it stops
    assert (len(timer.warmup_samples), len(timer.samples)) == (2, 3)
    assert timer.timing.samples == tuple(timer.samples)  # the median is over timed steps only


def test_speedup_facts() -> None:
    """Core question 8: 46% less time (1 - t_amp / t_fp32) is a speedup t_fp32 / t_amp of 1.85x;
    the wrong options are the usual misreadings (1 + 0.46, t_amp / t_fp32, 1 / 0.46)."""
    q = CORE_QUESTIONS[8]
    t_fp32, t_amp = 1.0, 0.54
    assert round(1 - t_amp / t_fp32, 2) == 0.46
    assert q.options[q.answer] == f"{t_fp32 / t_amp:.2f}x" == "1.85x"
    misreadings = {f"{1 + 0.46:.2f}x", f"{t_amp / t_fp32:.2f}x", f"{1 / 0.46:.2f}x"}
    assert set(q.options.values()) - {q.options[q.answer]} == misreadings


def test_inference_facts() -> None:
    """Core question 9: under inference_mode nothing is saved for backward, with or without
    autocast; the layers' outputs are 16-bit (half the bytes on a CPU) and the weights stay fp32."""
    torch.manual_seed(0)
    model = ConvModel(8, 1).eval()
    inputs, _ = make_problem(16)

    def serve(amp: bool):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            return model(inputs)

    assert saved_bytes(lambda: serve(True)) == saved_bytes(lambda: serve(False))
    assert saved_bytes(lambda: serve(True)).new + saved_bytes(lambda: serve(True)).held == 0
    ratio = (activation_output_bytes(model, lambda: serve(True))
             / activation_output_bytes(model, lambda: serve(False)))
    assert ratio == 0.5 and serve(True).dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert "16 bit" in CORE_QUESTIONS[9].options[CORE_QUESTIONS[9].answer]


def test_checkpoint_facts() -> None:
    """Core question 10: the scale lives in the scaler's state_dict, not the optimizer's; a new
    scaler starts at 2**16 until the saved state is loaded."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    model.weight.grad[0, 0] = float("inf")  # an overflow: the step is skipped, the scale backs off
    scaler.step(optimizer)
    scaler.update()
    state = scaler.state_dict()
    assert state["scale"] == 2.0**3 and set(state) == {
        "scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    assert set(optimizer.state_dict()) == {"state", "param_groups"}
    assert not any("scale" in key for group in optimizer.state_dict()["param_groups"]
                   for key in group)
    resumed = torch.amp.GradScaler("cpu")
    assert resumed.get_scale() == 2.0**16  # what a resume without the scaler's state starts from
    resumed.load_state_dict(state)
    assert resumed.get_scale() == 2.0**3
    assert "2**16" in CORE_QUESTIONS[10].options[CORE_QUESTIONS[10].answer]


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
