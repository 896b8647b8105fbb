"""The instructor's view of the class, from the stored attempts: who is where, who is stuck.

`class_view` turns attempts into learners by exercises. Each learner's *current* exercise is the
one of their latest attempt; they are *stuck* when that attempt failed, and the stuck come first:
most failed attempts on their current exercise since they last passed it, then the longest time
since any pass of theirs (since their first attempt if they never passed), then by name. Per
exercise, the most common mistake is the problem key seen in the most learners' failed attempts
(then in the most attempts), told in the course's own words for that key (course.json, from the
checkers), never in a learner's: the message a learner's server sends is any text it likes, so
it is shown only in that learner's row, marked as what their server sent.
`render_page` writes that as HTML (every learner-sent string escaped).
"""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from amp_progress.course import COURSE, Course
from amp_progress.store import Attempt

REFRESH_SECONDS = 10
SENT_TITLE = "what this learner's server sent with the attempt, as it sent it (not checked)"
MISTAKES_NOTE = ("In the course's own words for each key (… where the checker fills in what the "
                 "run found). What a learner's server sent appears only in that learner's row.")


@dataclass
class Cell:
    """One learner on one exercise."""

    attempts: int = 0
    failed: int = 0
    passed: bool = False  # passed at least once
    failed_since_pass: int = 0  # failed attempts after the last pass (all, if never passed)
    last_mistake: str = ""  # what the learner's server sent with the latest failed attempt
    last_keys: tuple[str, ...] = ()


@dataclass
class Learner:
    name: str
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    last_activity: str = ""
    current: tuple[str, str] | None = None  # (lesson, exercise) of the latest attempt
    last_pass: str = ""
    first_seen: str = ""

    @property
    def stuck(self) -> bool:
        cell = self.cells.get(self.current) if self.current else None
        return bool(cell and cell.failed_since_pass)

    @property
    def failed_on_current(self) -> int:
        return self.cells[self.current].failed_since_pass if self.stuck else 0


@dataclass
class Mistake:
    key: str
    learners: int
    attempts: int
    words: tuple[str, ...]  # the course's wordings of the key (course.json), never a learner's


@dataclass
class ClassView:
    exercises: list[tuple[str, str]]
    learners: list[Learner]  # stuck first
    mistakes: dict[tuple[str, str], Mistake]
    attempts: int


def seconds_between(earlier: str, later: datetime) -> float:
    return (later - datetime.fromisoformat(earlier)).total_seconds()


@dataclass
class LearnerPart:
    """One learner's share of the view, computed from their attempts alone, so that a change by
    one learner re-reads only theirs: their row, and per exercise and problem key the number of
    failed attempts that named it."""

    learner: Learner
    attempts: int
    keys: dict[tuple[str, str], Counter[str]]


def learner_part(name: str, attempts: Iterable[Attempt]) -> LearnerPart:
    """`name`'s row from their attempts (in any order)."""
    learner: Learner | None = None
    keys: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    count = 0
    for a in sorted(attempts, key=lambda a: (a.time, a.received, a.id)):
        count += 1
        exercise = (a.lesson, a.exercise)
        learner = learner or Learner(name, first_seen=a.time)
        cell = learner.cells.setdefault(exercise, Cell())
        cell.attempts += 1
        learner.last_activity, learner.current = a.time, exercise
        if a.passed:
            cell.passed, cell.failed_since_pass = True, 0
            learner.last_pass = a.time
            continue
        cell.failed += 1
        cell.failed_since_pass += 1
        cell.last_mistake, cell.last_keys = a.message, a.keys
        keys[exercise].update(a.keys)
    return LearnerPart(learner or Learner(name), count, dict(keys))


def combine(parts: Iterable[LearnerPart], now: datetime, course: Course = COURSE) -> ClassView:
    """The class from its learners' parts: stuck first, the most common mistakes in the course's
    words."""
    parts = [p for p in parts if p.attempts]
    key_learners: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    key_attempts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for part in parts:
        for exercise, by_key in part.keys.items():
            key_learners[exercise].update(by_key.keys())
            key_attempts[exercise].update(by_key)
    mistakes = {}
    for exercise, by_key in key_learners.items():
        key = min(by_key, key=lambda k: (-by_key[k], -key_attempts[exercise][k], k))
        mistakes[exercise] = Mistake(key, by_key[key], key_attempts[exercise][key],
                                     course.words_for(exercise, key))

    def order(learner: Learner) -> tuple[int, float, str]:
        since = seconds_between(learner.last_pass or learner.first_seen, now)
        return (-learner.failed_on_current, -since if learner.stuck else 0.0, learner.name)

    learners = [p.learner for p in parts]
    exercises = sorted({e for learner in learners for e in learner.cells})
    return ClassView(exercises, sorted(learners, key=order), mistakes,
                     sum(p.attempts for p in parts))


def class_view(attempts: Iterable[Attempt], now: datetime, course: Course = COURSE) -> ClassView:
    """Learners by exercises, ordered stuck first (see the module's docstring)."""
    by_user: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_user[a.user].append(a)
    return combine((learner_part(user, mine) for user, mine in by_user.items()), now, course)


def ago(when: str, now: datetime) -> str:
    """'42 s ago', '7 min ago', '3 h ago'."""
    seconds = max(0, int(seconds_between(when, now)))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def cell_html(cell: Cell | None) -> str:
    e = html.escape
    if cell is None:
        return '<td class="none">-</td>'
    tries = f"{cell.attempts} attempt{'s' if cell.attempts != 1 else ''}"
    if cell.passed and not cell.failed_since_pass:
        return f'<td class="passed">passed<br><small>{tries}</small></td>'
    state = "failed again after a pass" if cell.passed else "failed"
    sent = (f'<div class="sent" title="{SENT_TITLE}"><span class="from">their server sent:</span> '
            f"<q>{e(cell.last_mistake)}</q></div>" if cell.last_mistake else "")
    return (
        f'<td class="failed">{state}<br><small>{tries}</small>'
        f'<div class="keys">{e(", ".join(cell.last_keys))}</div>{sent}</td>'
    )


def course_words_html(words: tuple[str, ...]) -> str:
    """The course's wordings of a mistake's key, as the summary quotes them."""
    e = html.escape
    if not words:
        return ""
    if len(words) == 1:
        return f' <span class="course">The checker says: {e(words[0])}</span>'
    said = "".join(f"<li>{e(w)}</li>" for w in words)
    return (f' <span class="course">The checker says, depending on what the run found:</span>'
            f'<ul class="course">{said}</ul>')


def table_html(view: ClassView, now: datetime) -> str:
    """The part of the page that refreshes: the summary, the grid and the common mistakes."""
    e = html.escape
    if not view.learners:
        return '<p id="empty">No attempts recorded yet.</p>'
    stuck = sum(learner.stuck for learner in view.learners)
    head = "".join(f"<th>{e(lesson)} · {e(name)}</th>" for lesson, name in view.exercises)
    rows = []
    for learner in view.learners:
        where = "{} · {}".format(*learner.current) if learner.current else ""
        status = (
            f"stuck on {e(where)}: {learner.failed_on_current} failed"
            if learner.stuck
            else f"on {e(where)}"
        )
        rows.append(
            f'<tr class="learner{" stuck" if learner.stuck else ""}" '
            f'data-user="{e(learner.name)}"><th scope="row">{e(learner.name)}<br>'
            f"<small>{status}<br>last activity {e(ago(learner.last_activity, now))}</small></th>"
            + "".join(cell_html(learner.cells.get(x)) for x in view.exercises)
            + "</tr>"
        )
    mistakes = "".join(
        f'<li data-exercise="{e(lesson)} {e(name)}"><b>{e(lesson)} · {e(name)}</b>: '
        f"<code>{e(m.key)}</code>, {m.learners} learner{'s' if m.learners != 1 else ''}, "
        f"{m.attempts} attempt{'s' if m.attempts != 1 else ''}.{course_words_html(m.words)}</li>"
        for (lesson, name), m in sorted(view.mistakes.items())
    )
    return (
        f'<p id="summary">{len(view.learners)} learners, {stuck} stuck, {view.attempts} '
        f"attempts (updated {now:%H:%M:%S} UTC)</p>"
        f'<table id="grid"><thead><tr><th>learner</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<h2>Most common mistake per exercise</h2><p>{MISTAKES_NOTE}</p>"
        f'<ul id="mistakes">{mistakes}</ul>'
    )


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Class progress</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #bbb; padding: .4rem .6rem; vertical-align: top; max-width: 22rem; }}
td.passed {{ background: #d8f3dc; }} td.failed {{ background: #ffe0e0; }}
td.none {{ color: #999; text-align: center; }}
tr.stuck > th {{ background: #fff3bf; }}
.keys {{ font-family: monospace; font-size: .85em; }} .sent {{ font-size: .85em; }}
.sent .from {{ color: #666; font-style: italic; }} ul.course {{ margin: .2rem 0; }}
form {{ display: inline; }}
.notice {{ background: #ffe0e0; padding: .5rem; border: 1px solid #c00; }}
</style></head><body>
<h1>Class progress</h1>
<p>Signed in as {user}. Stuck learners first: most failed attempts on the exercise they are on,
then longest since a pass. Refreshes every {refresh} s.</p>
<p><a href="{prefix}attempts.csv">Export CSV</a>
<form method="post" action="{prefix}clear"
      onsubmit="return confirm('Delete every recorded attempt of the class?');">{xsrf}
<button type="submit">Clear all attempts</button></form></p>
{notice}<div id="class">{table}</div>
<script>
// The next fetch starts {refresh} s after the last one ended, never while one is under way.
async function refresh() {{
  try {{
    const reply = await fetch("{prefix}table", {{credentials: "same-origin"}});
    if (reply.ok) document.getElementById("class").innerHTML = await reply.text();
  }} finally {{
    setTimeout(refresh, {refresh_ms});
  }}
}}
setTimeout(refresh, {refresh_ms});
</script>
</body></html>
"""


def render_page(view: ClassView, now: datetime, user: str, prefix: str, xsrf_form: str,
                notice: str = "") -> str:
    """The whole page; `notice` is a problem the instructor must know of (the store's)."""
    return PAGE.format(
        notice=f'<p id="notice" class="notice">{html.escape(notice)}</p>' if notice else "",
        user=html.escape(user),
        refresh=REFRESH_SECONDS,
        refresh_ms=REFRESH_SECONDS * 1000,
        prefix=html.escape(prefix),
        xsrf=xsrf_form,
        table=table_html(view, now),
    )
