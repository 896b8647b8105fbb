"""The short quiz at the end of the exercise lesson: questions, answer key, and a checker.

The questions are defined once here; the notebook shows them with ``quiz_markdown()`` and the
learner answers in a dict ``{question number: "letter"}`` that ``check_quiz`` marks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from amp_tutorial.progress import record_attempt


@dataclass(frozen=True)
class Question:
    """One multiple-choice question: the lesson it covers ("07"), the text, lettered options, the
    right letter, and why.
    """

    lesson: str
    text: str
    options: dict[str, str]
    answer: str
    why: str


QUESTIONS: dict[int, Question] = {
    1: Question(
        "02",
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
        "What belongs inside `with torch.autocast(...)`?",
        {"a": "The forward pass and the loss.",
         "b": "The forward pass, the loss and `backward()`.",
         "c": "The whole step, including `optimizer.step()`.",
         "d": "Only the loss."},
        "a",
        "Backward runs each op's gradient in the dtype its forward used, without autocast; the "
        "optimizer must update the fp32 weights with fp32 gradients."),
    7: Question(
        "07",
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
    8: Question(
        "08",
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
    9: Question(
        "09",
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
    10: Question(
        "10",
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
    11: Question(
        "11",
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
    12: Question(
        "12",
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
    13: Question(
        "13",
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
    14: Question(
        "14",
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
    15: Question(
        "15",
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
    16: Question(
        "16",
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
    17: Question(
        "17",
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


def quiz_markdown() -> str:
    """The questions and their options as Markdown, for ``IPython.display.Markdown``.
    """
    parts = []
    for number, q in QUESTIONS.items():
        options = "\n".join(f"   - **{letter}**: {text}" for letter, text in q.options.items())
        parts.append(f"{number}. {q.text} *(lesson {q.lesson})*\n{options}")
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


def check_quiz(answers: Mapping[int, str | None] | object) -> QuizResult:
    """Mark ``{question number: letter}``; a right answer shows why, a wrong one only says so.
    Each check is recorded in the learner's progress (``amp_tutorial.progress``).
    """
    result = QuizResult()
    if not isinstance(answers, Mapping):
        kind = "None" if answers is None else f"a {type(answers).__name__} ({answers!r:.40})"
        for number in QUESTIONS:
            result.marks[number] = "unanswered"
        result.lines.append(
            f"`answers` is {kind}, not a dict: write `answers = {{1: \"b\", 2: \"a\", ...}}`, "
            "question number to letter.")
        record_attempt("06", "quiz", False, ["answers-not-a-dict"], result.lines[0])
        return result
    for number, q in QUESTIONS.items():
        given = answers.get(number, answers.get(str(number)))  # {"1": "b"} is meant the same
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
    keys = [f"question-{n}-{mark}" for n, mark in result.marks.items() if mark != "correct"]
    record_attempt("06", "quiz", result.all_correct, keys, str(result).splitlines()[0])
    return result
