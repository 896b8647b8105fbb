"""The reference answers of the graded exercises and quizzes, one file per exercise cell.

Each file is the whole source of a lesson's exercise cell as a correct answer would write it. The
test run and the handout put that source in place of the learner's cell (``course_tools.answers``),
and each checker runs the reference beside the learner's function on the same scenarios
(``amp_tutorial.exercises.checking``): one source for both. Try an exercise before reading its file.
"""

from pathlib import Path

FOLDER = Path(__file__).parent  # where the answer files are, for the tools that read them as text
