"""The README and the pages under docs/ say only what the repository has.

Every relative link reaches a file (and a heading, where the link names one in a Markdown page),
every ``pdm run`` command names a PDM script or a program, module or file that exists, every
``amp_tutorial.X`` / ``course_tools.X`` module named is a module under src/, the README stays a
front door (200 lines at most) and links every page under docs/. No network, no subprocess: the
files are read and resolved against the repository root.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.support import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib


README = ROOT / "README.md"
DOCS_PAGES = sorted((ROOT / "docs").glob("*.md"))
CHECKED = [README, ROOT / "CONTRIBUTING.md", *DOCS_PAGES]  # the Markdown a reader follows
README_MAX_LINES = 200
OWN_PACKAGES = ("amp_tutorial", "course_tools")  # under src/
OWN_TOP_LEVEL = (*OWN_PACKAGES, "tests", "scripts")  # `python -m` names resolved in the checkout

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
OWN_MODULE = re.compile(r"\b(amp_tutorial|course_tools)\.([A-Za-z_]\w*)")
PYTHON_M = re.compile(r"\b(?:python3?|torchrun)\b[^\n|;&]*?\s-m\s+([A-Za-z_][\w.]*)")
PLACEHOLDER = re.compile(r"NN|\*|<|>|\.\.\.|\$")  # notebooks/NN_topic.py, NN_*.py, <free port>


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- reading Markdown ----------------------------------------------------------------------------

@cache
def split_markdown(path: Path) -> tuple[list[str], str]:
    """The page's fenced code blocks, and its prose with those blocks removed."""
    text = path.read_text(encoding="utf-8")
    blocks = [match.group(0) for match in FENCE.finditer(text)]
    blocks = ["\n".join(block.splitlines()[1:-1]) for block in blocks]  # drop the fence lines
    return blocks, FENCE.sub("", text)


def inline_code(path: Path) -> list[str]:
    """Inline code spans of the prose (a span may wrap onto the next line)."""
    _, prose = split_markdown(path)
    return [" ".join(span.split()) for span in INLINE_CODE.findall(prose)]


def code_texts(path: Path) -> list[str]:
    """Every piece of code on the page: fenced blocks and inline spans."""
    blocks, _ = split_markdown(path)
    return [*blocks, *inline_code(path)]


def link_targets(path: Path) -> list[str]:
    """The targets of the page's links, outside code."""
    _, prose = split_markdown(path)
    prose = INLINE_CODE.sub("", prose)
    return LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)) or target.startswith("//")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    _, prose = split_markdown(path)
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(prose):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


# --- reading commands ----------------------------------------------------------------------------

def command_lines(code: str) -> list[str]:
    """Shell lines of a code text: continuation lines joined."""
    return code.replace("\\\n", " ").splitlines()


def split_shell(line: str) -> list[list[str]]:
    """The simple commands of one shell line, as token lists; comments dropped."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in prose-like code: split on blanks
        tokens = line.split("#")[0].split()
    commands, current = [], []
    for token in tokens:
        if token in {"&&", "||", ";", "|", "(", ")"}:
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    return [command for command in commands if command]


def pdm_run_commands(path: Path) -> list[list[str]]:
    """Every ``pdm run ...`` of the page's code, as the tokens after ``pdm run``."""
    found = []
    for code in code_texts(path):
        for line in command_lines(code):
            if "pdm run" not in line:
                continue
            for tokens in split_shell(line):
                for i in range(len(tokens) - 1):
                    if tokens[i] == "pdm" and tokens[i + 1] == "run" and len(tokens) > i + 2:
                        found.append(tokens[i + 2:])
                        break
    return found


@cache
def pdm_scripts() -> dict[str, str]:
    """``[tool.pdm.scripts]``: name -> the command line it runs."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    scripts = config.get("tool", {}).get("pdm", {}).get("scripts", {})
    commands = {}
    for name, spec in scripts.items():
        if name == "_":  # PDM's shared settings, not a script
            continue
        if isinstance(spec, str):
            commands[name] = spec
        elif isinstance(spec, dict):
            commands[name] = next((spec[key] for key in ("cmd", "shell", "call", "composite")
                                   if key in spec), "")
            if isinstance(commands[name], list):
                commands[name] = " ".join(map(str, commands[name]))
    return commands


def module_path(name: str) -> Path | None:
    """Where module ``name`` lives in the checkout (src/ first, then the root), or None."""
    parts = name.split(".")
    for base in (ROOT / "src", ROOT):
        stem = base.joinpath(*parts)
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py", stem / "__main__.py"):
            if candidate.is_file():
                return candidate
    return None


def module_problem(name: str) -> str | None:
    """Why ``python -m name`` cannot run, or None. The project's own modules must be files of the
    checkout (importing them would load torch); others must be importable here."""
    if name.split(".")[0] in OWN_TOP_LEVEL:
        if module_path(name) is None:
            return f"module {name!r} is no file under src/ or the repository root"
        return None
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"module {name!r} is not importable"


def file_problem(argument: str) -> str | None:
    """Why the file a command names does not exist, or None (placeholders are not checked)."""
    path = argument.split("::")[0]
    if PLACEHOLDER.search(path) or path.startswith("/"):  # NN_x.py, a path inside an image
        return None
    return None if (ROOT / path).exists() else f"file {path!r} does not exist"


def program_problem(tokens: list[str], scripts_seen: tuple[str, ...] = ()) -> str | None:
    """Why ``pdm run <tokens>`` names nothing that exists, or None."""
    name, args = tokens[0], tokens[1:]
    if name in pdm_scripts():
        if name in scripts_seen:
            return None
        target = pdm_scripts()[name]
        for command in split_shell(target):  # the script's own command must resolve too
            problem = program_problem(command, (*scripts_seen, name))
            if problem:
                return f"PDM script {name!r} = {target!r}: {problem}"
        return None
    if name in {"python", "python3"}:
        if "-c" in args:
            return None
        if "-m" in args:
            return module_problem(args[args.index("-m") + 1])
        scripts = [arg for arg in args if arg.endswith(".py")]
        return file_problem(scripts[0]) if scripts else None
    if name == "torchrun":
        if "-m" in args:
            return module_problem(args[args.index("-m") + 1])
        scripts = [arg for arg in args if arg.endswith(".py")]
        if not scripts:
            return "torchrun names no script and no module"
        return file_problem(scripts[0])
    if name in {"pytest", "ruff"} or executable_exists(name):
        paths = [arg for arg in args if not arg.startswith("-") and ("/" in arg or
                                                                     arg.endswith(".py"))]
        for path in paths:
            problem = file_problem(path)
            if problem:
                return problem
        return None if executable_exists(name) else f"{name!r} is not installed here"
    return f"{name!r} is no PDM script ({', '.join(pdm_scripts())}) and no installed program"


def executable_exists(name: str) -> bool:
    return (Path(sys.executable).parent / name).exists() or shutil.which(name) is not None


# --- the tests -----------------------------------------------------------------------------------

def test_there_are_pages_to_check() -> None:
    assert README.is_file(), "README.md is missing"
    assert DOCS_PAGES, "docs/ has no Markdown pages"


def test_readme_is_a_front_door() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail to a page under "
        "docs/ and link it")


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.split("#")[0]).resolve()
              for target in link_targets(README) if not is_external(target)}
    missing = [rel(page) for page in DOCS_PAGES if page.resolve() not in linked]
    assert not missing, f"README.md links no page {missing}; add them to 'Where to read more'"


@pytest.mark.parametrize("page", CHECKED, ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    problems = []
    for target in link_targets(page):
        if is_external(target):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            shown = rel(destination) if destination.is_relative_to(ROOT) else destination
            problems.append(f"{target}: {shown} does not exist")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{target}: {rel(destination)} has no heading with anchor #{anchor}")
    assert not problems, f"{rel(page)}: broken links:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", CHECKED, ids=rel)
def test_pdm_run_commands_name_what_exists(page: Path) -> None:
    problems = []
    for tokens in pdm_run_commands(page):
        problem = program_problem(tokens)
        if problem:
            problems.append(f"pdm run {shlex.join(tokens)}\n    -> {problem}")
    assert not problems, f"{rel(page)}: commands that cannot run:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", CHECKED, ids=rel)
def test_named_modules_exist(page: Path) -> None:
    """``python -m X`` / ``torchrun -m X`` of the course's own modules, and every
    ``amp_tutorial.X`` / ``course_tools.X`` the page names, are files under src/ (or the root)."""
    problems, reported = set(), set()
    for code in code_texts(page):
        for name in PYTHON_M.findall(code):
            if name.split(".")[0] in OWN_TOP_LEVEL:
                problem = module_problem(name)
                if problem:
                    problems.add(f"python -m {name} -> {problem}")
                    reported.add(name)
        for package, module in OWN_MODULE.findall(code):
            name = f"{package}.{module}"
            if name not in reported and module_path(name) is None:
                problems.add(f"{name} -> no src/{package}/{module}.py")
    assert not problems, (f"{rel(page)}: modules that do not exist:\n  "
                          + "\n  ".join(sorted(problems)))


# --- the checks' own parsing, on made-up text ----------------------------------------------------

def test_parsing_finds_links_commands_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A title\n\n## Problem sizes (presets)\n\nSee [x](other.md#a-title), "
        "[web](https://example.org) and `[not](a-link.md)`; run `pdm run bench --json`.\n\n"
        "```bash\nAMP=1 pdm run torchrun --nproc-per-node 2 \\\n    scripts/x.py  # comment\n"
        "echo [no](link.md) && pdm run python -m course_tools.catalogue table\n```\n",
        encoding="utf-8")
    try:
        assert link_targets(page) == ["other.md#a-title", "https://example.org"]
        assert anchors(page) == {"a-title", "problem-sizes-presets"}
        assert pdm_run_commands(page) == [
            ["torchrun", "--nproc-per-node", "2", "scripts/x.py"],
            ["python", "-m", "course_tools.catalogue", "table"],
            ["bench", "--json"],
        ]
        assert PYTHON_M.findall(code_texts(page)[0]) == ["course_tools.catalogue"]
    finally:
        split_markdown.cache_clear()
        anchors.cache_clear()
