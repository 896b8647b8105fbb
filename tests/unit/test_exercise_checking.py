"""The parts every exercise checker shares: a time limit on the learner's code, errors kept as
problems, the return-type check, and one report merged over the scenarios."""

from __future__ import annotations

import threading
import time

import pytest

from amp_tutorial.exercises import checking
from amp_tutorial.exercises.checking import Problem, attempt, collect, error_problem, type_problem


def test_a_run_that_returns_keeps_its_value() -> None:
    run = attempt(lambda a, b=0: a + b, 2, b=3)
    assert (run.value, run.error, run.timed_out) == (5, None, False)
    assert error_problem(run, "f") is None


def test_an_exception_is_kept_and_named_in_plain_words() -> None:
    run = attempt(lambda: 1 / 0)
    assert isinstance(run.error, ZeroDivisionError)
    problem = error_problem(run, "my_fn")
    assert problem.key == checking.RAISED
    assert problem.message == "my_fn raised ZeroDivisionError: division by zero"
    assert "consequence" in error_problem(run, "my_fn", after_others=True).message


def test_an_endless_loop_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checking, "TIME_LIMIT_S", 0.2)

    def endless() -> None:
        while True:
            pass

    run = attempt(endless)
    assert run.timed_out and 0.2 <= run.seconds < 2
    problem = error_problem(run, "endless")
    assert problem.key == checking.TIMED_OUT and "fixed number of times" in problem.message


def test_the_runs_of_one_check_share_one_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checking, "CHECK_BUDGET_S", 0.3)
    exercise = checking.Exercise("00", "slow", "fine", loops="the loop over the devices")

    @exercise.checker
    def check(fn) -> checking.CheckResult:
        runs = [attempt(fn) for _ in range(8)]  # eight simulated devices, say
        return exercise.report([(f"device {i}", [p] if (p := error_problem(run, "slow")) else [])
                                for i, run in enumerate(runs)])

    start = time.perf_counter()
    result = check(lambda: time.sleep(0.1))
    assert time.perf_counter() - start < 1.5  # not 8 x 0.1 s plus a limit for each
    assert result.keys == {checking.TIMED_OUT}
    assert "look at the loop over the devices" in result.problems[0].message
    assert "fixed number of times" not in result.problems[0].message
    assert check(lambda: None).passed  # a new check gets a new budget


def test_the_fix_is_shown_when_the_same_mistake_is_named_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AMP_TUTORIAL_WORKSPACE", str(tmp_path))
    exercise = checking.Exercise("00", "scaled", "fine")
    wrong = Problem.named("k", "You did X.", "X breaks Y.", "write Z.")
    other = Problem.named("j", "You did W.", "W breaks V.", "write U.")
    first = exercise.report([("fp16", [wrong])])
    assert "X breaks Y." in str(first) and "write Z" not in str(first)
    assert checking.NAMED_AGAIN in str(first)
    second = exercise.report([("fp16", [wrong, other])])
    assert "Instead: write Z." in str(second) and "write U" not in str(second)
    assert wrong.message in second.problems[0].message  # the record keeps the whole message


def test_outside_the_main_thread_the_code_runs_without_a_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checking, "TIME_LIMIT_S", 0.01)
    out = []
    worker = threading.Thread(target=lambda: out.append(attempt(sum, range(10**6))))
    worker.start()
    worker.join()
    assert out[0].error is None and out[0].value == sum(range(10**6))


def test_a_wrong_return_type_is_named_with_the_fix() -> None:
    assert type_problem(3, int, "f", "an int", "return n") is None
    problem = type_problem("float16", tuple, "f", "a tuple", "return (a, b, c)")
    assert problem.key == checking.WRONG_RETURN
    assert "returned str ('float16')" in problem.message and "Instead: return (a, b, c)" in (
        problem.message)


def test_problems_are_merged_over_scenarios_in_the_order_found() -> None:
    a, b = Problem("a", "A is wrong."), Problem("b", "B is wrong.")
    result = collect([("fp16", [a]), ("bf16", [b, a])], praise="fine")
    assert [p.key for p in result.problems] == ["a", "b"]
    assert result.problems[0].message == "[fp16; bf16] A is wrong."
    assert str(result).startswith("2 problem(s) found:")
    assert str(collect([("fp16", [])], praise="fine")) == "fine"


class _Handle:
    def __init__(self, shown: list[str]) -> None:
        self.shown = shown

    def update(self, data: dict, raw: bool = False) -> None:
        self.shown.append(data["text/plain"])


def test_a_check_in_a_notebook_says_it_is_working_and_then_takes_the_line_away(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 58: the first check after a kernel starts took 38-49 s on a busy machine with
    nothing on screen. In a notebook a line says it is working; when the check ends, also by an
    error, the line is emptied, so only the answer stays."""
    import IPython
    import IPython.display  # noqa: F401 (working_line reaches it as IPython.display)

    shown: list[str] = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())  # as in a kernel
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw, display_id: shown.append(data["text/plain"])
                        or _Handle(shown))
    with checking.working_line("Checking x..."):
        assert shown == ["Checking x..."]
    assert shown == ["Checking x...", ""]
    with pytest.raises(ValueError), checking.working_line("Checking y..."):
        raise ValueError
    assert shown[-1] == ""
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # a script or a test: nothing shown
    with checking.working_line("Checking z..."):
        pass
    assert "Checking z..." not in shown
