"""``pdm run lab``: the course in JupyterLab, on loopback only, with a token, rooted at notebooks/.

Extra arguments go straight to ``jupyter lab`` (e.g. ``pdm run lab --port 8890 --no-browser``).
The lab settings (open ``.py`` notebooks as notebooks, no news pop-up) are installed with the
package into the environment's ``etc/jupyter``, so a plain ``jupyter lab`` gets them too.
Lessons are paired (``notebooks/jupytext.toml``): saving a lesson also writes an ``.ipynb`` beside
it that keeps its outputs; the course's contents manager (``course_tools.pairing``) serves them.
"""

from __future__ import annotations

import os
import sys

from course_tools.catalogue import NOTEBOOKS_ENV, notebooks_dir

CONTENTS_MANAGER = "course_tools.pairing.CourseContentsManager"


def lab_command(extra: list[str]) -> list[str]:
    """The ``jupyter lab`` command line: 127.0.0.1:8888 unless overridden, never an empty token.
    """
    root = notebooks_dir()
    if not root.is_dir():
        raise SystemExit(f"error: no course folder at {root}; run this from the project checkout "
                         f"or set {NOTEBOOKS_ENV} to the notebooks/ folder")
    for arg in extra:
        if arg.replace("_", "-").split("=")[0] in ("--IdentityProvider.token", "--ServerApp.token",
                                                   "--NotebookApp.token") and arg.endswith("="):
            raise SystemExit("error: an empty token lets anyone who reaches the port run code; "
                             "leave it out to get a random one, or set JUPYTER_TOKEN")
    args = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}"]
    if not any("contents_manager_class" in a for a in extra):
        args.append(f"--ServerApp.contents_manager_class={CONTENTS_MANAGER}")
    if not any(a.startswith("--ip") or a.startswith("--ServerApp.ip") for a in extra):
        args.append("--ip=127.0.0.1")
    if not any(a.startswith("--port") or a.startswith("--ServerApp.port") for a in extra):
        args.append("--port=8888")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        # Jupyter refuses to start as root; containers and CI machines often are root.
        print("warning: running as root; the kernels can change anything on this machine",
              file=sys.stderr)
        args.append("--allow-root")
    return args + extra


def main() -> None:
    """The ``pdm run lab`` command: start JupyterLab on the course's notebooks.
    """
    command = lab_command(sys.argv[1:])
    # The kernels inherit this environment: the profiler's C++ log lines stay out of every one,
    # lessons or not (amp_tutorial.profiler_logs; the import brings torch, as start-lab's does).
    from amp_tutorial.profiler_logs import quiet_kineto_logs

    quiet_kineto_logs()
    print(f"Starting JupyterLab on the course in {command[3].split('=', 1)[1]}", flush=True)
    print("Open the http://127.0.0.1:...?token=... URL that Jupyter prints below.", flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
