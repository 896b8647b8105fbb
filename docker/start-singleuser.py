#!/usr/bin/env python
"""A learner's server under the workshop hub (docker-compose.hub.yml): the course, then Jupyter.

DockerSpawner (or Zero to JupyterHub) starts the course image with this command and the hub's
arguments. The learner's own volume is mounted at /home/learner/work ($AMP_TUTORIAL_WORK to
change it). Every course file that is not
there yet is copied in from the image's /home/learner/notebooks; a file already there is left as
it is, so a learner's edits survive a restart and a newer image only adds lessons. Then
jupyterhub-singleuser runs, which takes its token and URL prefix from the hub's environment.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from amp_tutorial.device import gpu_access_problem

COURSE = Path("/home/learner/notebooks")
WORK = "/home/learner/work"  # the learner's volume (DockerSpawner) or home storage (Kubernetes)


def copy_missing(source: Path, target: Path) -> list[Path]:
    """Copy each file under `source` to `target` unless a file of that name is there already."""
    added = []
    for path in sorted(source.rglob("*")):
        destination = target / path.relative_to(source)
        if path.is_dir() or destination.exists() or "__pycache__" in path.parts:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
        added.append(destination)
    return added


def main() -> None:
    work = Path(os.environ.get("AMP_TUTORIAL_WORK", WORK))
    os.environ["AMP_TUTORIAL_NOTEBOOKS"] = str(work)  # the image's default is COURSE
    added = copy_missing(COURSE, work)
    print(f"course files copied into {work}: {len(added)} new, existing ones kept", flush=True)
    if problem := gpu_access_problem():
        print(f"\nwarning: the lessons will run on the CPU: {problem}\n", file=sys.stderr,
              flush=True)
    os.chdir(work)
    os.execvp("jupyterhub-singleuser", ["jupyterhub-singleuser", *sys.argv[1:]])


if __name__ == "__main__":
    main()
