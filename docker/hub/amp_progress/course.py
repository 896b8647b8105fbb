"""The course's graded exercises, mistake keys and words for each key, as the service knows them.

They come from course.json beside this module, which `python -m course_tools.exercise_manifest`
writes from the course's own checkers (never typed here a second time): a post about any other
(lesson, exercise) pair or key is refused, so the instructor's page has one column per exercise
of the course, whatever a learner sends. The words are what the checkers say for each key (``…``
where the run fills them in), per exercise, and for the keys every checker shares: the page quotes
these for the class's most common mistakes, never what a learner's server sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = Path(__file__).with_name("course.json")


@dataclass(frozen=True)
class Course:
    exercises: frozenset[tuple[str, str]]
    keys: frozenset[str]
    # (lesson, exercise) -> key -> the checker's wordings of it, in the checker's order
    words: dict[tuple[str, str], dict[str, tuple[str, ...]]] = field(default_factory=dict)
    shared_words: dict[str, tuple[str, ...]] = field(default_factory=dict)  # checking.py's, ...

    def words_for(self, exercise: tuple[str, str], key: str) -> tuple[str, ...]:
        """What the course says for `key` at `exercise`: the exercise's own wordings, else those
        of the code every checker shares; () when the course has none (say only the key)."""
        return self.words.get(exercise, {}).get(key) or self.shared_words.get(key, ())


def load(path: Path = MANIFEST) -> Course:
    data = json.loads(path.read_text(encoding="utf-8"))
    words: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    for lesson, exercise, key, said in data.get("words", []):  # absent before the words came
        words.setdefault((lesson, exercise), {})[key] = tuple(said)
    return Course(frozenset((lesson, name) for lesson, name in data["exercises"]),
                  frozenset(data["keys"]), words,
                  {key: tuple(said) for key, said in data.get("shared_words", [])})


COURSE = load()
