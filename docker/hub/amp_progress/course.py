"""The course's graded exercises and mistake keys, as the service accepts them.

They come from course.json beside this module, which `python -m course_tools.exercise_manifest`
writes from the course's own checkers (never typed here a second time): a post about any other
(lesson, exercise) pair or key is refused, so the instructor's page has one column per exercise
of the course, whatever a learner sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).with_name("course.json")


@dataclass(frozen=True)
class Course:
    exercises: frozenset[tuple[str, str]]
    keys: frozenset[str]


def load(path: Path = MANIFEST) -> Course:
    data = json.loads(path.read_text(encoding="utf-8"))
    return Course(frozenset((lesson, name) for lesson, name in data["exercises"]),
                  frozenset(data["keys"]))


COURSE = load()
