#!/usr/bin/env python
"""A learner's server under the workshop hub (docker-compose.hub.yml): the course, then Jupyter.

DockerSpawner (or Zero to JupyterHub) starts the course image with this command and the hub's
arguments. The learner's own volume is mounted at /home/learner/work ($AMP_TUTORIAL_WORK to
change it). The course in the image (/home/learner/notebooks) is brought into it by
course_tools.course_update: new files are copied in, a lesson the learner did not edit takes a
newer image's text (its paired .ipynb keeps the outputs of unchanged cells), an edited one is kept
and listed in COURSE_UPDATES.md (`course-update take NAME` gives the new version, theirs kept
beside it). Then jupyterhub-singleuser runs, which takes its token and URL prefix from the hub's
environment; the course's contents manager (pairing) comes from the image's Jupyter config.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from amp_tutorial.device import gpu_access_problem
from course_tools.course_update import IMAGE_COURSE, NOTICE, update_course

WORK = "/home/learner/work"  # the learner's volume (DockerSpawner) or home storage (Kubernetes)


def main() -> None:
    work = Path(os.environ.get("AMP_TUTORIAL_WORK", WORK))
    os.environ["AMP_TUTORIAL_NOTEBOOKS"] = str(work)  # the image's default is IMAGE_COURSE
    report = update_course(IMAGE_COURSE, work)
    print(f"course files in {work}: {len(report.added)} new, {len(report.updated)} updated, "
          f"{len(report.kept_edited)} edited by the learner and kept", flush=True)
    if report.kept_edited:
        print(f"newer versions wait for {', '.join(report.kept_edited)} (see {NOTICE})",
              flush=True)
    if problem := gpu_access_problem():
        print(f"\nwarning: the lessons will run on the CPU: {problem}\n", file=sys.stderr,
              flush=True)
    os.chdir(work)
    os.execvp("jupyterhub-singleuser", ["jupyterhub-singleuser", *sys.argv[1:]])


if __name__ == "__main__":
    main()
