"""What the tests of every graded exercise's checker assert the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from amp_tutorial.exercises import checking, training_spy
from amp_tutorial.exercises.checking import RAISED, CheckResult


def assert_names(result: CheckResult, key: str, also_raises: bool = False) -> None:
    """The checker rejected the answer for ``key`` and nothing else (and RAISED beside it when
    ``also_raises``: the mistake makes torch raise), each problem with a message."""
    assert not result.passed
    expected = {key, RAISED} if also_raises else {key}
    assert result.keys == expected, str(result)
    assert all(p.message for p in result.problems)


def checker_tests(check: Callable[[object], CheckResult], mistakes: list[tuple],
                  keys: set[str], correct: dict[str, object], praise: str) -> tuple:
    """The three tests every checker's test module runs over its own tables, for the module to
    bind to ``test_*`` names: ``mistakes`` rows ``(case, answer, key[, also raises])``, each
    rejected for its key alone (with RAISED beside it where the mistake makes torch raise), in
    plain words; every key the checker can name (``keys``, from ``problem_keys``) has a row, but
    RAISED and TIMED_OUT, which ``test_exercise_checkers`` raises and loops in every checker; and
    each ``correct`` answer passes with the checker's ``praise`` and nothing else."""
    def case(row: tuple) -> object:
        also_raises = row[3] if len(row) > 3 else False
        return pytest.param(row[1], row[2], also_raises, id=row[0])

    @pytest.mark.parametrize(("answer", "key", "also_raises"), [case(row) for row in mistakes])
    def each_mistake_is_named(answer: object, key: str, also_raises: bool) -> None:
        result = check(answer)
        assert_names(result, key, also_raises)
        assert "Traceback" not in str(result), str(result)

    def every_problem_key_has_a_case() -> None:
        covered = {row[2] for row in mistakes} | {checking.RAISED, checking.TIMED_OUT}
        assert covered - set(checking.STATE_KEYS) == keys

    @pytest.mark.parametrize("name", list(correct))
    def correct_answers_pass(name: str) -> None:
        result = check(correct[name])
        assert result.passed, str(result)
        assert str(result) == praise

    return each_mistake_is_named, every_problem_key_has_a_case, correct_answers_pass


def named_twice(check: Callable[[object], CheckResult], answer: object) -> str:
    """What the learner reads after checking ``answer`` twice: the second time, each mistake
    named the first time comes with what to write instead (``checking.CheckResult.shown``)."""
    first = check(answer)
    second = check(answer)
    assert first.keys == second.keys
    return str(second)


def answers(mistakes: list[tuple]) -> dict[str, object]:
    """A checker test's wrong answers by case name, for the tests that quote one."""
    return {row[0]: row[1] for row in mistakes}


def problem_keys(module: ModuleType, *not_keys: str) -> set[str]:
    """The problem keys an exercise module can name: its UPPER_CASE string constants (its own
    and those it imports, such as the training spy's), less ``not_keys`` (settings such as a
    device type or the praise text), plus those of the frame every checker runs in: a learner's
    function that raises or runs past the limit (``checking.RAISED``, ``checking.TIMED_OUT``),
    and a wrong type of answer where the checker asks ``checking.type_problem``; the training
    spy's shared rules where the checker uses them (``shared_problems``, ``simulated_problems``).
    The keys of ``checking.left_behind`` are left out: ``test_exercise_checkers`` runs each of
    them through every checker."""
    own = {value for name, value in vars(module).items()
           if name.isupper() and not name.startswith("_") and isinstance(value, str)
           and value not in not_keys}
    frame = {checking.RAISED, checking.TIMED_OUT}
    if getattr(module, "type_problem", None) is checking.type_problem:
        frame.add(checking.WRONG_RETURN)
    if getattr(module, "shared_problems", None) is training_spy.shared_problems:
        frame |= set(training_spy.SHARED_KEYS)
    if getattr(module, "simulated_problems", None) is training_spy.simulated_problems:
        frame |= set(training_spy.SIMULATED_KEYS)
    return (own - set(checking.STATE_KEYS)) | frame


def variant(solution: Path, name: str, *changes: tuple[str, str]) -> Callable[..., object]:
    """The reference solution's function ``name`` with each ``(old, new)`` text replaced once: a
    wrong solution that differs from the right one by exactly the change named."""
    source = solution.read_text()
    for old, new in changes:
        assert source.count(old) == 1, f"{old!r} is not in {solution.name} exactly once"
        source = source.replace(old, new)
    namespace: dict[str, object] = {}
    exec(compile(source, f"<{solution.stem}, changed>", "exec"), namespace)  # noqa: S102
    return namespace[name]  # type: ignore[return-value]


def clip_without_min(indent: int) -> tuple[str, str]:
    """The change that makes the solutions' clip a hand-written one whose factor lacks
    min(1, ...), so it scales small gradients up (``indent``: the clip line's, in spaces)."""
    pad = " " * indent
    return ("torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
            "norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()\n"
            f"{pad}for p in model.parameters():\n"
            f"{pad}    p.grad.mul_(max_grad_norm / norm)")


def spy_mistakes(solution: Path, name: str, clip_indent: int) -> list[tuple]:
    """The training spy's shared and simulated-device mistakes, each made by changing one line of
    a training solution that takes ``device_type`` and ``amp_dtype``: ``(case, wrong function,
    key, also raises)`` rows for a checker test's MISTAKES."""
    cpu = ("autocast(device_type=device_type", 'autocast(device_type="cpu"')
    by_device = ("dtype=amp_dtype)", 'dtype=amp_dtype if device_type in ("cpu", "cuda") '
                 "else torch.bfloat16)")
    return [
        ("clip by hand without min(1, max_norm / norm)",
         variant(solution, name, clip_without_min(clip_indent)), training_spy.CLIPPED_UP, False),
        ('autocast with a hard-coded "cpu"', variant(solution, name, cpu),
         training_spy.AUTOCAST_OTHER_DEVICE, False),
        ("bfloat16 on devices other than cpu and cuda", variant(solution, name, by_device),
         training_spy.DTYPE_BY_DEVICE, False),
        # one verdict in every checker: accumulation called this "ran without autocast"
        ("autocast dtype hard-coded to bfloat16",
         variant(solution, name, ("dtype=amp_dtype)", "dtype=torch.bfloat16)")),
         training_spy.WRONG_AUTOCAST_DTYPE, False),
    ]


def assert_quoted(result: CheckResult, words: str, case: str) -> None:
    """The mistake's message quotes what GradScaler raised for it; a RuntimeError (a call order
    it refuses) is reported beside it as RAISED, in torch's words, while one of its internal
    checks (``checking.SCALER_ASSERTS``, an AssertionError) is never a finding of its own."""
    named = next(p.message for p in result.problems if p.key != checking.RAISED)
    assert words in named, (case, named)
    raised = [p.message for p in result.problems if p.key == checking.RAISED]
    internal = any(found in words for found in checking.SCALER_ASSERTS)
    assert (raised == []) == internal, (case, raised)
    assert all(words in message for message in raised), (case, raised)
