"""The short quiz at the end of the exercise lesson: questions, answer key, and a checker.

The questions are defined once here; the notebook shows them with ``quiz_markdown()`` and the
learner answers in a dict ``{question number: "letter"}`` that ``check_quiz`` marks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Question:
    """One multiple-choice question: the text, lettered options, the right letter, and why.
    """

    text: str
    options: dict[str, str]
    answer: str
    why: str


QUESTIONS: dict[int, Question] = {
    1: Question(
        "Why does GradScaler multiply the loss by a large factor before `backward()`?",
        {"a": "To make the loss converge faster, like a larger learning rate.",
         "b": "So that small gradients, computed in float16 during backward, land above fp16's "
              "underflow threshold instead of flushing to zero.",
         "c": "To convert the loss to float32.",
         "d": "To detect NaNs in the forward pass."},
        "b",
        "Every gradient is multiplied by the same factor, so tiny ones move into fp16's range; "
        "they are divided by it again (in fp32) before the optimizer step, so the update is "
        "unchanged."),
    2: Question(
        "Why is GradScaler not needed when training with bfloat16?",
        {"a": "bfloat16 has more mantissa bits than float16.",
         "b": "bfloat16 has fp32's 8 exponent bits: the same smallest normal number, 2**-126, and "
              "a largest value of about 3.4e38.",
         "c": "Autocast computes the backward pass in float32 when the dtype is bfloat16.",
         "d": "GradScaler does not work with bfloat16."},
        "b",
        "Underflow is a range problem. Gradients too small for fp16 (its smallest normal number "
        "is 2**-14, about 6.1e-5, and below about 3e-8 it rounds to zero) are normal bf16 numbers "
        "down to 2**-126, as in fp32; only bf16's subnormals stop sooner (2**-133, fp32's "
        "2**-149). bf16 has fewer mantissa bits (precision) than fp16, which scaling would not "
        "fix anyway."),
    3: Question(
        "Why are the weights kept in float32 (the 'master copy') in mixed-precision training?",
        {"a": "An update lr * grad is often smaller than the spacing between 16-bit numbers "
              "near the weight, so adding it to a 16-bit weight would round it away.",
         "b": "Optimizers cannot read 16-bit gradients.",
         "c": "To halve the memory of the weights.",
         "d": "Because autocast only accepts float32 inputs."},
        "a",
        "fp16 keeps about 3.3 decimal digits (bf16 about 2.4): w + 1e-5 == w for w near 1. fp32 "
        "weights accumulate many small updates; autocast casts them to 16 bit per op."),
    4: Question(
        "You train with Adam and call `clip_grad_norm_(model.parameters(), max_norm)` right after "
        "`scaler.scale(loss).backward()`, without `scaler.unscale_(optimizer)`. What happens?",
        {"a": "Nothing changes: clipping does not depend on the scale.",
         "b": "Every update becomes about `scale` times smaller, as if the learning rate had been "
              "divided by the scale.",
         "c": "The clip measures `scale` times the true norm, so it acts as if max_norm were "
              "max_norm / scale: it clips nearly every step, and Adam, which hardly notices a "
              "uniformly smaller gradient, keeps stepping as if clipping were always on.",
         "d": "GradScaler raises an error."},
        "c",
        "The gradients are still multiplied by the scale (65536 at first), so the clip fires at "
        "max_norm / scale of the true norm. With SGD that would shrink every step by the scale "
        "(answer b); Adam divides by the gradient's own RMS, so its steps keep their size, but "
        "the clip is no longer the one you set. Unscale first, then clip, then "
        "`scaler.step(optimizer)`."),
    5: Question(
        "One gradient contains an inf. What do `scaler.step(optimizer)` and `scaler.update()` do?",
        {"a": "They raise an error.",
         "b": "They replace the inf by the largest float16 value and step.",
         "c": "They skip `optimizer.step()` (the weights stay as they were) and multiply the "
              "scale by backoff_factor (0.5 by default).",
         "d": "They step and halve the learning rate."},
        "c",
        "A skipped step costs one batch; the smaller scale makes the next overflow less likely. "
        "After growth_interval good steps in a row the scale grows again."),
    6: Question(
        "What belongs inside `with torch.autocast(...)`?",
        {"a": "The forward pass and the loss.",
         "b": "The forward pass, the loss and `backward()`.",
         "c": "The whole step, including `optimizer.step()`.",
         "d": "Only the loss."},
        "a",
        "Backward runs each op's gradient in the dtype its forward used, without autocast; the "
        "optimizer must update the fp32 weights with fp32 gradients."),
}


def quiz_markdown() -> str:
    """The questions and their options as Markdown, for ``IPython.display.Markdown``.
    """
    parts = []
    for number, q in QUESTIONS.items():
        options = "\n".join(f"   - **{letter}**: {text}" for letter, text in q.options.items())
        parts.append(f"{number}. {q.text}\n{options}")
    return "\n\n".join(parts)


@dataclass
class QuizResult:
    """Per-question marks; ``all_correct`` is True only when every question is answered right.
    """

    marks: dict[int, str] = field(default_factory=dict)  # "correct", "wrong" or "unanswered"
    lines: list[str] = field(default_factory=list)

    @property
    def all_correct(self) -> bool:
        return all(mark == "correct" for mark in self.marks.values())

    @property
    def score(self) -> int:
        return sum(mark == "correct" for mark in self.marks.values())

    def __str__(self) -> str:
        return "\n".join([f"Score: {self.score} / {len(self.marks)}", *self.lines])


def check_quiz(answers: Mapping[int, str | None]) -> QuizResult:
    """Mark ``{question number: letter}``; a right answer shows why, a wrong one only says so.
    """
    result = QuizResult()
    for number, q in QUESTIONS.items():
        given = answers.get(number)
        given = given.strip().lower() if isinstance(given, str) else None
        if given is None or given == "":
            result.marks[number] = "unanswered"
            result.lines.append(f"{number}. not answered yet")
        elif given not in q.options:
            result.marks[number] = "wrong"
            result.lines.append(f"{number}. {given!r} is not one of {', '.join(q.options)}")
        elif given == q.answer:
            result.marks[number] = "correct"
            result.lines.append(f"{number}. correct: {q.why}")
        else:
            result.marks[number] = "wrong"
            result.lines.append(f"{number}. not {given!r}: think again (re-run to check)")
    return result
