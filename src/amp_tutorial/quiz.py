"""The course's two quizzes: the core quiz at the end of lesson 06 (lessons 01-05) and the
advanced quiz at the end of lesson 17 (lessons 07-17), with their answer keys and one checker.

No quiz asks about a lesson after the one it is in. Each question names the lesson and the section
(its heading, as the lesson writes it) that teach it: a wrong answer sends the learner there, and a
right one says why. A lesson shows its quiz with ``CORE_QUIZ.markdown()`` (or ``ADVANCED_QUIZ``),
and the learner answers in a dict ``{question number: "letter"}`` that ``CORE_QUIZ.check(answers)``
marks; the common spellings of a letter ("B", "b)", "(b)", "b.", ["b"]) are read as that letter.
Each check is recorded under the quiz's lesson as exercise "quiz" (``amp_tutorial.progress``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from amp_tutorial.progress import record_attempt


@dataclass(frozen=True)
class Question:
    """One multiple-choice question: the lesson it covers ("07") and the section to reread there
    (a ``##`` or ``###`` heading's text, without the hashes), the text, lettered options, the
    right letter, and why.
    """

    lesson: str
    section: str
    text: str
    options: dict[str, str]
    answer: str
    why: str


# Lessons 01-05, asked at the end of lesson 06 (the core track's exercise).
CORE_QUESTIONS: dict[int, Question] = {
    1: Question(
        "02",
        "1. The problem: fp16 gradients flush to zero",
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
        "02",
        "5. bfloat16 needs no scaler",
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
        "01",
        "1. Three float formats",
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
        "02",
        "Adam: a clip meant for spikes fires on every step",
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
        "02",
        "3. The scale over time",
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
        "01",
        "4. Only the forward pass and the loss go inside autocast",
        "What belongs inside `with torch.autocast(...)`?",
        {"a": "The forward pass and the loss.",
         "b": "The forward pass, the loss and `backward()`.",
         "c": "The whole step, including `optimizer.step()`.",
         "d": "Only the loss."},
        "a",
        "Backward runs each op's gradient in the dtype its forward used, without autocast; the "
        "optimizer must update the fp32 weights with fp32 gradients."),
    7: Question(
        "03",
        "How we measure (and what the original blog got wrong)",
        "Lesson 03's `StepTimer` synchronises the device before each clock read and leaves the "
        "first steps untimed. Why both?",
        {"a": "Synchronising makes the GPU finish each op sooner, and the first steps are left out "
              "because their loss is still far from the final one.",
         "b": "Both matter only on a CPU: there PyTorch queues ops and returns at once, while a "
              "GPU runs each op before the Python line returns.",
         "c": "Synchronising resets the allocator's peak memory before each step, and the warm-up "
              "steps let the GradScaler settle on its scale.",
         "d": "GPU work runs asynchronously (a line returns once the work is queued), so the clock "
              "must wait for it; the first steps pay one-off costs, such as picking kernels."},
        "d",
        "Read without a synchronise, the clock stops while work is still queued, and that work's "
        "time is left out (the blog read its clock before `torch.cuda.synchronize()`). cuDNN and "
        "MIOpen pick their kernels on first use (on ROCm the first call for a new shape can take "
        "seconds). StepTimer also times every step and reports the median and the interquartile "
        "range, not one total, so noise shows as spread."),
    8: Question(
        "03",
        "How we measure (and what the original blog got wrong)",
        "The blog reported \"speedup: 46%\", computed as `1 - t_amp / t_fp32`, the fraction of "
        "time saved. What is that as a speedup, `t_fp32 / t_amp`?",
        {"a": "1.46x", "b": "1.85x", "c": "0.54x", "d": "2.17x"},
        "b",
        "46% less time leaves AMP 0.54 of fp32's time per step, and 1 / 0.54 = 1.85: AMP ran at "
        "1.85 times fp32's speed. \"Percent less time\" (`1 - t_amp / t_fp32`) and speedup "
        "(`t_fp32 / t_amp`, a ratio) are different numbers; say which one you print."),
    9: Question(
        "04",
        "What the inference gain depends on",
        "You serve a trained model with `model.eval()`, `torch.inference_mode()` and "
        "`torch.autocast`. Compared with the same loop in fp32, which memory does autocast save?",
        {"a": "None: without a backward pass there is nothing for a 16-bit format to shrink.",
         "b": "The weights': autocast stores them in 16 bit, which halves the model's size.",
         "c": "The tensors saved for backward, which it halves as it does in training.",
         "d": "The activations the forward pass holds: the layers' outputs come out in 16 bit (for "
              "the course model, about half of fp32's bytes on CPU, CUDA and XPU)."},
        "d",
        "Under `inference_mode` autograd records nothing and saves no tensors for backward, so "
        "what shrinks is the activations alive during the forward pass. The weights stay fp32: "
        "autocast casts copies of them on the way into each lowered op. With no gradients there "
        "is nothing to underflow, so no GradScaler either."),
    10: Question(
        "05",
        "3. Checkpoints: save and resume model, optimizer and scaler together",
        "An fp16 run's checkpoint holds the model's and the optimizer's `state_dict()` but not the "
        "scaler's. What happens when the run resumes from it?",
        {"a": "`load_state_dict` raises: the optimizer's state refers to a scaler that is missing.",
         "b": "Nothing changes: the scale is stored in the optimizer's `state_dict()` too.",
         "c": "The new scaler starts over at its initial scale (2**16 by default), so the run may "
              "skip steps again while it relearns the scale, unlike a run that never stopped.",
         "d": "The weights come back in float16: the scaler held their fp32 copies."},
        "c",
        "The scaler's `state_dict()` holds the scale, its growth and backoff factors, the growth "
        "interval and the count of good steps in a row; the optimizer's holds only its own state "
        "(Adam's moments and step count) and its parameter groups. Save the scaler's beside the "
        "model's and the optimizer's (and your data order), and load all of them."),
}

# Lessons 07-17, asked at the end of lesson 17 (lesson 19, FSDP2, came later and has none yet).
ADVANCED_QUESTIONS: dict[int, Question] = {
    1: Question(
        "07",
        "Why `binary_cross_entropy` is refused, and `binary_cross_entropy_with_logits` is the fix",
        "Under CUDA float16 autocast, what does `F.binary_cross_entropy(torch.sigmoid(logits), y)` "
        "do?",
        {"a": "Autocast refuses it with a RuntimeError (\"unsafe to autocast\"); the fix is "
              "`F.binary_cross_entropy_with_logits(logits, y)`.",
         "b": "It runs in float16, like the matmuls before it.",
         "c": "Autocast runs it in float32, so it is safe.",
         "d": "It runs, but only with the GradScaler turned off."},
        "a",
        "On CUDA (and XPU) `binary_cross_entropy` is on autocast's banned list; CPU autocast runs "
        "it in float32 instead. The trouble is the 16-bit sigmoid: it rounds a confident "
        "probability to exactly 1.0, and BCE clamps the resulting log(0) at -100: the loss is a "
        "flat 100 however wrong the prediction. The logits form fuses sigmoid and log stably, "
        "and autocast runs it in float32 on CPU and CUDA."),
    2: Question(
        "08",
        "1. Migrating old code",
        "On a machine without CUDA, your script uses `torch.amp.GradScaler(\"cuda\")` and "
        "`torch.autocast(\"cuda\")`. What happens?",
        {"a": "Both raise an error: there is no CUDA device.",
         "b": "Both fall back to CPU autocast in bfloat16.",
         "c": "Both warn and switch themselves off: the run trains in plain fp32, without an "
              "error.",
         "d": "Only the deprecated `torch.cuda.amp` spellings switch off; the `torch.amp` ones "
              "raise."},
        "c",
        "Both constructors check for CUDA (`torch/amp/grad_scaler.py`, "
        "`torch/amp/autocast_mode.py`), warn \"... Disabling.\" and disable themselves, old "
        "spellings or new; `autocast(\"cuda\")` never changes ops on CPU tensors anyway. Pass "
        "the device type you use (`info.type` in the course)."),
    3: Question(
        "09",
        "1. Skipped steps and learning-rate schedulers",
        "Your fp16 loop calls `scaler.step(optimizer)`, `scaler.update()`, then "
        "`scheduler.step()`, yet the first iteration warns \"Detected call of "
        "`lr_scheduler.step()` before `optimizer.step()`\". Why?",
        {"a": "The order is wrong: `scheduler.step()` belongs between `scaler.step(optimizer)` "
              "and `scaler.update()`.",
         "b": "GradScaler replaces `optimizer.step`, so the scheduler cannot see it run.",
         "c": "GradScaler always skips the first step, to measure the gradients' range.",
         "d": "The first step overflowed at the initial scale (2**16), so `scaler.step` skipped "
              "`optimizer.step()`, and the scheduler saw no optimizer step before its own."},
        "d",
        "The scheduler wraps `optimizer.step` and checks at its own first step that it ran "
        "(`torch/optim/lr_scheduler.py`); a skipped step never calls it. Usually harmless: the "
        "schedule runs a step ahead. To keep it aligned, step the scheduler only when "
        "`scaler.get_scale()` did not go down."),
    4: Question(
        "10",
        "1. Calls autocast leaves alone",
        "Inside `torch.autocast`, in what dtype does `torch.mm(a, b, out=buf)` compute, with "
        "`a`, `b` and `buf` in float32?",
        {"a": "In the autocast dtype; the result is cast into `buf` afterwards.",
         "b": "float32: autocast leaves calls with `out=` alone, and in-place ops too.",
         "c": "It raises: `buf` must have the autocast dtype.",
         "d": "bfloat16 on CPU, float32 on CUDA."},
        "b",
        "Only out-of-place ops are eligible for autocast (torch.amp docs, \"Op-Specific "
        "Behavior\"): an `out=` call or an in-place op runs as it would with autocast off, on "
        "every device. An explicit `dtype=` argument is obeyed too."),
    5: Question(
        "11",
        "Several processes: DistributedDataParallel with AMP",
        "With DistributedDataParallel and float16 AMP, one process gets an inf gradient. What "
        "happens?",
        {"a": "Only that process skips its step; DDP brings the weights back in sync at the next "
              "forward.",
         "b": "Rank 0's GradScaler skips the step and broadcasts its decision; the other ranks "
              "have no scaler.",
         "c": "Every process skips the step: each has its own GradScaler, and it checks "
              "gradients DDP has already all-reduced, so every process sees the inf.",
         "d": "DDP refuses to all-reduce non-finite gradients and raises."},
        "c",
        "DDP averages the gradients across processes during `backward()`, so an inf on one rank "
        "is an inf or NaN on all; every rank's scaler skips and halves its scale, and the "
        "scales stay equal. Autocast goes around the forward and loss of the wrapped model, as "
        "on one device."),
    6: Question(
        "12",
        "2. Inside one block: which op ran in which dtype",
        "In a pre-norm transformer under CUDA float16 autocast, which of these runs in float16?",
        {"a": "The layer norms.",
         "b": "The residual additions `x + attn(x)`.",
         "c": "The linear layers and `scaled_dot_product_attention`.",
         "d": "A hand-written `scores.softmax(-1)`."},
        "c",
        "On CUDA, linear, matmul and SDPA are on autocast's lower-precision list; `layer_norm` is "
        "on its float32 list and `softmax` on its float32-output list; an fp32 residual stream "
        "plus an fp16 branch gives fp32 by ordinary type promotion. (Where no fused kernel fits, "
        "SDPA's math fallback computes in fp32 inside, lesson 13.) On CPU, layer norm and softmax "
        "are on no list and keep a bf16 input's dtype."),
    7: Question(
        "13",
        "1. Attention in float16: the two classic failures and their fixes",
        "You hide padding in float16 attention scores with `scores.masked_fill(mask, -1e9)`. "
        "What happens?",
        {"a": "It raises a RuntimeError: -1e9 cannot be converted to float16 without overflow. "
              "Use `torch.finfo(scores.dtype).min`, or a boolean mask passed to SDPA.",
         "b": "It works: -1e9 is a large negative number in every dtype.",
         "c": "-1e9 is clamped to -65504, so it works like `torch.finfo(torch.float16).min`.",
         "d": "-1e9 underflows to 0, so the masked positions get attention."},
        "a",
        "float16's largest magnitude is 65504: `masked_fill` refuses the value (\"value cannot "
        "be converted to type c10::Half without overflow\"). A -1e9 mask built in fp32 and cast "
        "to fp16 becomes -inf instead, and a fully masked row of -inf gives softmax 0/0 = NaN; "
        "`finfo(dtype).min` keeps it finite. bfloat16 holds -1e9."),
    8: Question(
        "14",
        "1. What compile sees",
        "You call a `torch.compile`d model inside `torch.autocast`. What happens to autocast's "
        "casts?",
        {"a": "Nothing: compile ignores autocast, and the compiled model runs in fp32.",
         "b": "Compile cannot trace casts: call `model.half()` before compiling.",
         "c": "Compile breaks the graph at every autocast region, so nothing inside is compiled.",
         "d": "They are traced into the graph as ordinary cast nodes (`_to_copy`), which Inductor "
              "can fuse into the neighbouring elementwise kernels."},
        "d",
        "AOTAutograd traces the forward with autocast active, so each cast becomes a graph node "
        "(lesson 14 counts them with `make_fx`); a `with torch.autocast` inside compiled code "
        "causes no graph break either. Convolutions and matmuls still go to the vendor "
        "libraries in low precision. Measure the step time, and report the first call's compile "
        "time apart."),
    9: Question(
        "15",
        "1. Updates that round away",
        "You train with `model.to(torch.bfloat16)` and Adam (lr 1e-3), without autocast. What "
        "goes wrong, compared with bf16 autocast?",
        {"a": "Nothing: bf16 has fp32's range, so pure bf16 trains like AMP.",
         "b": "Small updates round away (a weight at 1.0 does not move by 1e-3), and Adam's "
              "moving averages are bf16 too.",
         "c": "The gradients underflow, because there is no GradScaler.",
         "d": "The matmuls run in fp32, because autocast is off."},
        "b",
        "bf16 keeps 8 significant bits: just below 1.0 its numbers are 2**-8 apart, so "
        "1.0 - 1e-3 rounds back to 1.0. Adam creates its state like the parameters. AMP keeps "
        "fp32 weights, gradients and Adam state (16 bytes per weight, against 8); for "
        "inference, where weights never change, casting once is right."),
    10: Question(
        "16",
        "1. The FP8 formats, and why they need a scale",
        "Why does FP8 training (torchao's float8, for example) keep a scale per tensor?",
        {"a": "To convert between the e4m3 and e5m2 formats.",
         "b": "One loss scale, as fp16's GradScaler uses, would do; per-tensor scales only make "
              "it faster.",
         "c": "e4m3 (float8_e4m3fn) holds normal numbers only from 2**-6 to 448: unscaled, "
              "gradient-sized values (1e-3) round to zero or keep few bits, large ones saturate.",
         "d": "FP8 formats have no exponent bits, so values must be scaled into [-1, 1]."},
        "c",
        "float8_e4m3fn has 3 mantissa bits, smallest normal 2**-6 and largest 448, and any value "
        "of magnitude 2**-10 (about 1e-3) or less rounds to zero (e5m2, for gradients: 2 "
        "mantissa bits, 2**-14 to 57344). The recipe multiplies a tensor so its largest "
        "magnitude lands at the format's largest value, casts, and divides the result by the "
        "same scale."),
    11: Question(
        "17",
        "1. The profiler, with input dtypes",
        "How do you check that a model's matmuls really ran in low precision under autocast?",
        {"a": "Profile a step with `torch.profiler.profile(record_shapes=True)` and read each "
              "op's input dtypes (`addmm` on bf16 inputs, for example).",
         "b": "Read `layer.weight.dtype` after the forward: autocast changes it.",
         "c": "Compare the loss with an fp32 run: if it differs, the matmuls were lowered.",
         "d": "`torch.is_autocast_enabled()` is True inside the region, so every matmul was "
              "lowered."},
        "a",
        "With `record_shapes=True` the profiler records each op's input shapes and dtypes "
        "(`event.input_dtypes`). Weights stay fp32 under autocast (it casts copies), a loss "
        "differs for many reasons, and autocast lowers only the ops on its lists (not an `out=` "
        "call, for one)."),
}


def _number(key: object) -> int | None:
    """A question number written as an int or as digits ("3", " 3 "); None otherwise."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.strip().isdigit():
        return int(key.strip())
    return None


_LETTER = re.compile(r"\(?\s*([a-z])\s*[).:]?")  # b, (b), b), b., b:
_COLLECTIONS = (list, tuple, set, frozenset)


def read_letter(given: object) -> tuple[str | None, str | None]:
    """``(letter, None)`` for an answer in a common spelling ("B", " b ", "b)", "(b)", "b.",
    ["b"], ("b",), {"b"}); ``(None, None)`` when it is blank; ``(None, why)`` when it cannot be
    read as one letter.
    """
    if isinstance(given, _COLLECTIONS):
        items = list(given)
        if not items:
            return None, None
        if len(items) > 1:
            return None, f"one letter was expected, not {len(items)}: {given!r:.40}"
        given = items[0]
    if given is None:
        return None, None
    if not isinstance(given, str):
        return None, f"a letter in quotes, such as \"b\", was expected, not {given!r:.40}"
    text = given.strip().lower()
    if not text:
        return None, None
    match = _LETTER.fullmatch(text)
    if match is None:
        return None, f"one letter, such as \"b\", was expected, not {given!r:.40}"
    return match.group(1), None


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


@dataclass(frozen=True)
class Quiz:
    """A quiz at the end of ``lesson``: its questions, numbered from 1, each on that lesson or an
    earlier one. Its checks are recorded as the lesson's exercise "quiz".
    """

    lesson: str
    questions: dict[int, Question]

    def markdown(self) -> str:
        """The questions and their options as Markdown, for ``IPython.display.Markdown``."""
        parts = []
        for number, q in self.questions.items():
            options = "\n".join(f"   - **{letter}**: {text}" for letter, text in q.options.items())
            parts.append(f"{number}. {q.text} *(lesson {q.lesson})*\n{options}")
        return "\n\n".join(parts)

    def check(self, answers: Mapping[int | str, object] | object) -> QuizResult:
        """Mark ``{question number: letter}``: a right answer shows why; a wrong one names the
        lesson and section to reread, not the right letter. Each check is recorded in the
        learner's progress (``amp_tutorial.progress``).
        """
        result = QuizResult()
        if not isinstance(answers, Mapping):
            kind = "None" if answers is None else f"a {type(answers).__name__} ({answers!r:.40})"
            result.marks = dict.fromkeys(self.questions, "unanswered")
            result.lines.append(
                f"`answers` is {kind}, not a dict: write `answers = {{1: \"b\", 2: \"a\", ...}}`, "
                "question number to letter.")
            record_attempt(self.lesson, "quiz", False, ["answers-not-a-dict"], result.lines[0])
            return result
        given, unknown = {}, []
        for key, value in answers.items():
            number = _number(key)
            if number not in self.questions:
                unknown.append(key)
            elif number not in given or isinstance(key, int):  # {1: ..} before {"1": ..}
                given[number] = value
        for number, q in self.questions.items():
            result.marks[number], line = self._mark(number, q, given.get(number))
            result.lines.append(f"{number}. {line}")
        if unknown:
            result.lines.append(
                f"Not questions of this quiz: {', '.join(map(repr, unknown)):.60}; it has "
                f"questions 1 to {len(self.questions)}.")
        keys = [f"question-{n}-{mark}" for n, mark in result.marks.items() if mark != "correct"]
        record_attempt(self.lesson, "quiz", result.all_correct, keys, str(result).splitlines()[0])
        return result

    @staticmethod
    def _mark(number: int, q: Question, given: object) -> tuple[str, str]:
        """The mark of one answer and the line that explains it."""
        letter, problem = read_letter(given)
        if problem is not None:
            return "wrong", f"{problem} (this question's letters: {', '.join(q.options)})"
        if letter is None:
            return "unanswered", "not answered yet"
        if letter not in q.options:
            return "wrong", f"{letter!r} is not one of {', '.join(q.options)}"
        if letter == q.answer:
            return "correct", f"correct: {q.why}"
        return "wrong", (f"not {letter!r}: reread lesson {q.lesson}, section \"{q.section}\", "
                         "then change your answer and re-run")


CORE_QUIZ = Quiz("06", CORE_QUESTIONS)
ADVANCED_QUIZ = Quiz("17", ADVANCED_QUESTIONS)
QUIZZES = (CORE_QUIZ, ADVANCED_QUIZ)
