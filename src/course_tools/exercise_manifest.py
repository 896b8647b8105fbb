"""The course's graded exercises and their mistake keys, written for the hub's progress service.

The workshop hub's `amp-progress` service (docker/hub/amp_progress) takes only attempts at the
course's own exercises, so that a learner cannot fill the instructor's page with made-up columns.
It learns them from a manifest, ``docker/hub/amp_progress/course.json``, that this module writes
from the course itself: every :class:`~amp_tutorial.exercises.checking.Exercise` declared in an
``amp_tutorial.exercises`` module, each quiz of ``amp_tutorial.quiz.QUIZZES`` (found by running
it), every problem key a checker can name (the modules' key constants, found in their source), and
the course's own words for each key: every wording a checker's ``Problem(KEY, message)`` or
``Problem.named(KEY, what, why, fix)`` gives it (the what and the fix), read from the source with
``…`` where the run fills the words in, and for a quiz's key its question. The instructor's page
quotes these words for the class's most common mistake, never a learner's: a learner's server can
send any text it likes. The hub's image holds no torch, so the file is generated here and
committed; ``tests/unit/test_hub_progress.py`` fails when it is not what this module writes now
(after a checker gains a key or new words, run ``python -m course_tools.exercise_manifest`` and
commit the file).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import amp_tutorial.exercises
from amp_tutorial import quiz
from amp_tutorial.exercises.checking import Exercise

MANIFEST = Path(__file__).resolve().parents[2] / "docker/hub/amp_progress/course.json"
KEY = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
PROBLEM_CALLS = {"Problem", "named"}  # Problem(KEY, ...) and Problem.named(KEY, ...)


def exercise_modules() -> list:
    """Every module of the amp_tutorial.exercises package, imported."""
    package = amp_tutorial.exercises
    return [importlib.import_module(f"{package.__name__}.{info.name}")
            for info in pkgutil.iter_modules(package.__path__)]


def module_keys(module) -> set[str]:
    """The problem keys a checker module defines: its module-level constants whose value is a
    kebab-case name, either hyphenated or passed straight to ``Problem``/``Problem.named``
    (``DEVICE_TYPE = "cpu"`` is neither)."""
    tree = ast.parse(inspect.getsource(module))
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str) and KEY.fullmatch(node.value.value)
    }
    passed = {
        node.args[0].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) in PROBLEM_CALLS
    }
    return {value for name, value in constants.items() if "-" in value or name in passed}


def quiz_attempts() -> list[tuple[str, str, list[str], str]]:
    """(lesson, exercise, keys, message) of each quiz's attempts, all unanswered, all wrong and not
    a dict: run, with the recording caught, so that the quizzes' own code names their exercises
    and keys."""
    seen: list[tuple[str, str, list[str], str]] = []

    def caught(lesson, exercise, passed, keys, message):
        seen.append((str(lesson), str(exercise), sorted(keys), str(message)))

    with mock.patch.object(quiz, "record_attempt", caught):
        for each in quiz.QUIZZES:
            each.check({})
            each.check({n: next(letter for letter in q.options if letter != q.answer)
                        for n, q in each.questions.items()})
            each.check(None)
    return seen


# --- the course's words for each key -----------------------------------------------------------

PLACEHOLDER = "…"  # where the checker's words depend on the run (a count, a dtype, your value)
QUIZ_KEY = re.compile(r"question-(\d+)-(wrong|unanswered)")  # amp_tutorial.quiz's keys
QUIZ_MARKS = {"wrong": "answered wrong", "unanswered": "not answered yet"}
FIELD = re.compile(r"\{[^{}]*\}")  # a str.format field


def _is_text(node: ast.expr) -> bool:
    """A literal string, an f-string, a sum of them, or "...".format(...)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_text(node.left) and _is_text(node.right)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format" and _is_text(node.func.value))


def _render(node: ast.expr, names: dict[str, str]) -> str:
    """The words a string expression of the source says: `names` gives the text of a name (a
    module's constant, or a helper's parameter as its caller passed it), PLACEHOLDER stands for
    every other part the run fills in (an f-string's or a format's fields, a variable)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant)
            else names.get(v.value.id, PLACEHOLDER) if (
                isinstance(v.value, ast.Name) and v.conversion == -1 and v.format_spec is None)
            else PLACEHOLDER
            for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _render(node.left, names) + _render(node.right, names)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"):
        return FIELD.sub(PLACEHOLDER, _render(node.func.value, names))
    if isinstance(node, ast.Name):
        return names.get(node.id, PLACEHOLDER)
    return PLACEHOLDER


def _has_words(text: str) -> bool:
    return bool(text.strip(" .,:;()" + PLACEHOLDER))


def _said(parts: list[str]) -> str:
    """One problem's words: a Problem's message, or a Problem.named's what (its why when the what
    is all the run's) and its fix; the why is the lesson's, too long for a summary line."""
    if len(parts) >= 3:
        what = parts[0] if _has_words(parts[0]) else parts[1]
        text = f"{what} Instead: {parts[2]}" if _has_words(parts[2]) else what
    else:
        text = parts[0]
    text = re.sub(f"{PLACEHOLDER}+", PLACEHOLDER, " ".join(text.split()))
    return re.sub(f"([.!?`]){PLACEHOLDER}$", r"\1", text)  # a hint the run may add, at the end


def _constants(tree: ast.Module) -> dict[str, str]:
    return {node.targets[0].id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


@dataclass
class Source:
    """One checker module's source: its tree, the string constants it can name (its own and
    those it imports from the package) and where its imported names come from."""

    name: str
    tree: ast.Module
    names: dict[str, str]
    imported: dict[str, tuple[str, str]]  # local name -> (module, name there)

    @classmethod
    def of(cls, module, modules: dict[str, object]) -> Source:
        tree = ast.parse(inspect.getsource(module))
        names, imported = {}, {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                theirs = _constants(ast.parse(inspect.getsource(modules[node.module])))
                for alias in node.names:
                    local = alias.asname or alias.name
                    imported[local] = (node.module, alias.name)
                    if alias.name in theirs:
                        names[local] = theirs[alias.name]
        return cls(module.__name__, tree, names | _constants(tree), imported)


def _problem_calls(root: ast.AST, names: dict[str, str], keys: set[str]
                   ) -> list[tuple[ast.AST, str, list[ast.expr]]]:
    """(node, key, word arguments) of each ``Problem(KEY, message)`` and
    ``Problem.named(KEY, what, why, fix)`` under `root`, and of each rule-table row
    ``(..., KEY, what, why, fix)`` whose words such a call formats."""
    found = []
    for node in ast.walk(root):
        if isinstance(node, ast.Call) and node.args and (
                getattr(node.func, "attr", getattr(node.func, "id", None)) in PROBLEM_CALLS):
            args = node.args
        elif isinstance(node, ast.Tuple):
            named = [i for i, e in enumerate(node.elts)
                     if isinstance(e, ast.Name) and names.get(e.id) in keys]
            args = node.elts[named[0]:] if len(named) == 1 else []
            if len(args) not in (2, 4) or not all(_is_text(e) for e in args[1:]):
                continue
        else:
            continue
        key = names.get(args[0].id) if isinstance(args[0], ast.Name) else None
        if key in keys:
            found.append((node, key, args[1:]))
    return found


def _params(function: ast.FunctionDef) -> list[str]:
    a = function.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _helpers(sources: dict[str, Source], keys: set[str]) -> dict[tuple[str, str], list]:
    """(module, function) -> its problem calls, for each function that makes a problem from its
    own parameters (``error_problem(run, name)``, ``bad(message)``): a call that passes it words
    says them."""
    helpers = {}
    for source in sources.values():
        for function in ast.walk(source.tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            params = set(_params(function))
            calls = [c for c in _problem_calls(function, source.names, keys)
                     if any(isinstance(n, ast.Name) and n.id in params
                            for arg in c[2] for n in ast.walk(arg))]
            if calls:
                helpers[(source.name, function.name)] = (function, source.names, calls)
    return helpers


def _words(nodes: list[ast.expr], names: dict[str, str]) -> str | None:
    """A problem call's words (None when the run fills in all of them)."""
    said = _said([_render(n, names) for n in nodes]) if nodes else ""
    return said if _has_words(said) else None


def source_words(source: Source, helpers: dict, keys: set[str]) -> dict[str, list[str]]:
    """key -> every wording a checker module gives it, in the source's order: its own problem
    calls and rule rows, and its calls of a helper that it passes words to (the helper's own
    module has the helper's general words)."""
    sites: list[tuple[int, int, str, str]] = []
    for node, key, args in _problem_calls(source.tree, source.names, keys):
        said = _words(args, source.names)
        if said and isinstance(node, ast.Tuple):  # a rule's words are str.format templates
            said = FIELD.sub(PLACEHOLDER, said).replace("{{", "{").replace("}}", "}")
        if said:
            sites.append((node.lineno, node.col_offset, key, said))
    for call in ast.walk(source.tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        name = call.func.id
        helper = helpers.get(source.imported.get(name, (source.name, name)))
        if helper is None:
            continue
        function, names, calls = helper
        params = _params(function)
        given = dict(zip(params, call.args, strict=False)) | {
            k.arg: k.value for k in call.keywords if k.arg}
        bound = {p: _render(given[p], source.names) if p in given and _is_text(given[p])
                 else PLACEHOLDER for p in params}
        if all(text == PLACEHOLDER for text in bound.values()):
            continue  # nothing passed but the run's values: the helper's general words say it
        for _, key, args in calls:
            said = _words(args, names | bound)
            if said:
                sites.append((call.lineno, call.col_offset, key, said))
    words: dict[str, list[str]] = {}
    for _, _, key, said in sorted(sites):
        if said not in words.setdefault(key, []):
            words[key].append(said)
    return words


def quiz_words(quizzes, attempts: list[tuple[str, str, list[str], str]]
               ) -> dict[tuple[str, str], dict[str, list[str]]]:
    """(lesson, "quiz") -> key -> words: a question's key quotes the question and where to reread
    it; any other key (``answers-not-a-dict``) the words the quiz itself recorded with it."""
    questions = {quiz.lesson: quiz.questions for quiz in quizzes}
    words: dict[tuple[str, str], dict[str, list[str]]] = {}
    for lesson, exercise, keys, message in attempts:
        for key in keys:
            asked = QUIZ_KEY.fullmatch(key)
            q = asked and questions.get(lesson, {}).get(int(asked[1]))
            said = (f'Question {asked[1]}, "{q.text}": {QUIZ_MARKS[asked[2]]} (lesson {q.lesson}, '
                    f'section "{q.section}").' if q else " ".join(message.split()))
            words.setdefault((lesson, exercise), {}).setdefault(key, [said])
    return words


def manifest() -> dict:
    """The exercises (lesson, name), the keys, and the course's words for each key: per exercise
    (its checker's module, and its quiz) every wording of it, and the shared words of the modules
    every checker uses (checking.py's ``raised``, ...), said where an exercise has none of its
    own; each sorted."""
    modules = exercise_modules()
    by_name = {m.__name__: m for m in modules}
    exercises_of = {m.__name__: sorted({(e.lesson, e.name) for e in vars(m).values()
                                        if isinstance(e, Exercise)}) for m in modules}
    exercises = set().union(*map(set, exercises_of.values()))
    keys = set().union(*(module_keys(m) for m in modules))
    attempts = quiz_attempts()
    for lesson, exercise, quiz_keys, _ in attempts:
        exercises.add((lesson, exercise))
        keys.update(quiz_keys)
    sources = {name: Source.of(m, by_name) for name, m in by_name.items()}
    helpers = _helpers(sources, keys)
    words: dict[tuple[str, str], dict[str, list[str]]] = quiz_words(quiz.QUIZZES, attempts)
    shared: dict[str, list[str]] = {}
    for name, source in sorted(sources.items()):
        said = source_words(source, helpers, keys)
        for exercise in exercises_of[name]:
            words.setdefault(exercise, {}).update(said)
        if not exercises_of[name]:  # a module the checkers share
            for key, wordings in said.items():
                shared.setdefault(key, [])
                shared[key] += [w for w in wordings if w not in shared[key]]
    return {
        "generated_by": "python -m course_tools.exercise_manifest (do not edit by hand)",
        "exercises": [list(e) for e in sorted(exercises)],
        "keys": sorted(keys),
        "words": [[*exercise, key, wordings] for exercise, said in sorted(words.items())
                  for key, wordings in sorted(said.items())],
        "shared_words": [[key, wordings] for key, wordings in sorted(shared.items())],
    }


def text() -> str:
    """The manifest as JSON, one exercise, key or key's words a line (reviewable in a diff)."""
    data = manifest()
    fields = ("exercises", "keys", "words", "shared_words")
    rows = {name: ",\n".join(f"  {json.dumps(v, ensure_ascii=False)}" for v in data[name])
            for name in fields}
    body = ",\n".join(f' "{name}": [\n{rows[name]}\n ]' for name in fields)
    return f'{{"generated_by": {json.dumps(data["generated_by"])},\n{body}}}\n'


def main(argv: list[str] | None = None) -> int:
    """Write the manifest; with --check, exit 1 when the committed one differs."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        fresh = MANIFEST.read_text(encoding="utf-8") == text()
        print(f"{MANIFEST}: {'up to date' if fresh else 'stale: run without --check'}")
        return 0 if fresh else 1
    MANIFEST.write_text(text(), encoding="utf-8")
    print(f"wrote {MANIFEST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
