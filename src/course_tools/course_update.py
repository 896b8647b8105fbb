"""Bring a newer course into a learner's folder without losing their work (the workshop hub).

The policy, applied to every file of the course (``update_course``):
- a file the learner does not have yet is copied in;
- a file the learner did not edit (it is byte for byte what the course last delivered, recorded
  in ``.course/manifest.json``) takes the new text; its paired ``.ipynb`` keeps the outputs of
  the cells whose source did not change (Jupytext matches them when it opens the pair) and drops
  those of changed cells, which Jupytext would otherwise hand by position to the new source;
- a file the learner edited is never overwritten: the update is listed in ``COURSE_UPDATES.md``
  and the start log, and ``course-update take NAME`` (``python -m course_tools.course_update``)
  gives the new version, after renaming the learner's lesson and its outputs to ``NAME.mine-...``.
Every copy gets a fresh modification time, never the course's older one (no ``cp -p``): Jupytext
refuses to open a pair whose ``.ipynb`` is newer than its ``.py`` when their inputs differ.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat

MANIFEST = Path(".course/manifest.json")  # what the course last delivered: {relative path: sha256}
NOTICE = "COURSE_UPDATES.md"  # in the learner's folder while an edited lesson has a newer version
COURSE_ENV = "AMP_TUTORIAL_COURSE"  # where the course's own copy lives (the image's notebooks/)
IMAGE_COURSE = Path("/home/learner/notebooks")
SKIPPED = ("__pycache__", ".ipynb_checkpoints")


@dataclass
class Report:
    """What ``update_course`` did, by relative path."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    kept_edited: list[str] = field(default_factory=list)  # a newer version waits: `take` gives it


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def course_files(course: Path) -> list[Path]:
    """The course's files, relative to ``course``: no outputs (.ipynb), checkpoints or caches."""
    return [p.relative_to(course) for p in sorted(course.rglob("*"))
            if p.is_file() and p.suffix != ".ipynb" and not set(SKIPPED) & set(p.parts)]


def install(source: Path, destination: Path) -> None:
    """Write ``source``'s bytes to ``destination`` with a fresh time, never older than its
    ``.ipynb`` twin, so Jupytext reads the inputs from the text and the outputs from the pair."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(source.read_bytes())
    twin = destination.with_suffix(".ipynb")
    stamp = max(time.time(), twin.stat().st_mtime if twin.exists() else 0.0)
    os.utime(destination, (stamp, stamp))


def drop_stale_outputs(ipynb: Path, new_text: Path) -> None:
    """Clear the outputs of the cells of ``ipynb`` whose source is not in ``new_text``'s lesson."""
    if not ipynb.exists() or new_text.suffix != ".py":
        return
    with contextlib.suppress(Exception):  # unreadable: the lab renames it when it opens the lesson
        notebook = nbformat.read(ipynb, as_version=4)
        sources = {c.source for c in jupytext.read(new_text).cells if c.cell_type == "code"}
        for cell in notebook.cells:
            if cell.cell_type == "code" and cell.source not in sources:
                cell.outputs, cell.execution_count = [], None
        nbformat.write(notebook, ipynb)


def _read_manifest(work: Path) -> dict[str, str]:
    try:
        return json.loads((work / MANIFEST).read_text())
    except (OSError, ValueError):  # none yet (a first start, or a volume from an older image)
        return {}


def _write_manifest(work: Path, manifest: dict[str, str]) -> None:
    path = work / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    path.with_suffix(".tmp").replace(path)


def update_course(course: Path, work: Path) -> Report:
    """Apply the policy above to every course file; record what was delivered."""
    manifest, report = _read_manifest(work), Report()
    for rel in course_files(course):
        key, source, destination = rel.as_posix(), course / rel, work / rel
        new = _sha256(source)
        if not destination.exists():
            install(source, destination)
            report.added.append(key)
        else:
            mine = _sha256(destination)
            if mine == new:
                twin = destination.with_suffix(".ipynb")
                if twin.exists() and twin.stat().st_mtime > destination.stat().st_mtime + 1:
                    # an older-timed copy (cp -p, rsync -t, docker cp) of this text: Jupytext
                    # would refuse the pair. Its text is the course's, so the policy above holds.
                    drop_stale_outputs(twin, source)
                    install(source, destination)
                    report.updated.append(key)
            elif manifest.get(key) == mine:  # unedited since the course delivered it
                drop_stale_outputs(destination.with_suffix(".ipynb"), source)
                install(source, destination)
                report.updated.append(key)
            elif manifest.get(key) == new:  # edited by the learner; the course has not changed
                continue
            else:  # edited, or delivered before manifests existed: the learner's text wins
                report.kept_edited.append(key)
                continue
        manifest[key] = new
    _write_manifest(work, manifest)
    _write_notice(work, report.kept_edited)
    return report


def _write_notice(work: Path, waiting: list[str]) -> None:
    notice = work / NOTICE
    if not waiting:
        notice.unlink(missing_ok=True)
        return
    lines = ["# Course updates waiting", "",
             "The course brought a version of these lessons that differs from your edited copy.",
             "Yours is kept. To get the course's, open a Terminal and run the command beside it:",
             "your lesson and its outputs are renamed `NAME.mine-DATE.py` / `.ipynb` first.",
             ""]
    lines += [f"- `{name}`: `course-update take {name}`" for name in waiting]
    notice.write_text("\n".join(lines) + "\n")


def take_new_version(course: Path, work: Path, name: str) -> Path:
    """Give the learner the course's version of ``name``; their copy (and its ``.ipynb``) is
    renamed ``<stem>.mine-<UTC time><suffix>`` beside it. Returns the renamed ``.py``."""
    source, destination = course / name, work / name
    if not source.is_file():
        raise SystemExit(f"error: the course has no {name}; names are relative to {course}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = destination.with_name(f"{destination.stem}.mine-{stamp}{destination.suffix}")
    if destination.exists():
        twin = destination.with_suffix(".ipynb")
        if twin.exists():
            twin.rename(kept.with_suffix(".ipynb"))
        destination.rename(kept)
    install(source, destination)
    update_course(course, work)  # records the delivery, rewrites the list of waiting updates
    return kept


def main(argv: list[str] | None = None) -> None:
    """``course-update [take NAME]``: apply the update policy, or take one lesson's new version."""
    parser = argparse.ArgumentParser(prog="course-update", description=__doc__.split("\n")[0])
    parser.add_argument("action", nargs="?", choices=["sync", "take"], default="sync")
    parser.add_argument("name", nargs="?", help="take: the lesson, e.g. 03_amp_training.py")
    parser.add_argument("--course", type=Path,
                        default=Path(os.environ.get(COURSE_ENV, IMAGE_COURSE)))
    parser.add_argument("--work", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    if args.action == "take":
        if not args.name:
            parser.error("take needs the lesson's name")
        kept = take_new_version(args.course, args.work, args.name)
        print(f"{args.name} is now the course's version; yours is kept as {kept.name}")
        return
    report = update_course(args.course, args.work)
    print(f"course files in {args.work}: {len(report.added)} new, {len(report.updated)} updated "
          f"(outputs of unchanged cells kept), {len(report.kept_edited)} edited by you and kept",
          flush=True)
    if report.kept_edited:
        print(f"newer versions wait for: {', '.join(report.kept_edited)} (see {NOTICE})",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
