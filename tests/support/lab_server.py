"""A throwaway JupyterLab server for tests: started as ``pdm run lab`` starts it, always stopped.

The server gets a free loopback port, a random token (in ``JUPYTER_TOKEN``, so it stays out of
``ps``), and its own Jupyter config, data and runtime folders, so a developer's ``~/.jupyter``
settings, saved workspace or user kernels cannot change what the test sees. The course's own lab
settings still apply: they live in ``{sys.prefix}/etc/jupyter``. Every process started for a test
carries a marker in its environment (kernels inherit it), so teardown can prove none is left.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from course_tools.catalogue import NOTEBOOKS_ENV
from course_tools.lab import lab_command

START_TIMEOUT_S = 90  # JupyterLab answers in 2-7 s here; a loaded CI machine gets headroom
STOP_TIMEOUT_S = 30


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``marker`` (``NAME=value``); Linux only."""
    wanted = marker.encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            entries = environ.read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if wanted in entries:
            found.append(int(environ.parent.name))
    return found


@dataclass
class LabServer:
    """A running JupyterLab: its URL, token, course folder, log file and process."""

    url: str
    token: str
    root: Path
    log: Path
    process: subprocess.Popen

    def api(self, path: str, method: str = "GET", *, token: str | None = "") -> tuple[int, Any]:
        """Call the REST API; ``token=""`` sends the server's token, ``None`` sends none."""
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        if token is not None:
            request.add_header("Authorization", f"token {token or self.token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body = response.read()
                return response.status, json.loads(body) if body else None
        except urllib.error.HTTPError as err:
            return err.code, None

    def send(self, path: str, method: str, body: Any = None) -> tuple[int, Any]:
        """Call the REST API with a JSON body; an error's JSON body (its ``message``) comes back
        too, as the lab shows it to the learner."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            text = err.read()
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, {"message": text.decode(errors="replace")}

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def shutdown_kernels(self) -> None:
        """Stop every kernel, as Kernel > Shut Down All Kernels does: frees a lesson's memory."""
        status, kernels = self.api("/api/kernels")
        for kernel in kernels if status == 200 else []:
            self.api(f"/api/kernels/{kernel['id']}", "DELETE")

    def stop(self) -> None:
        """Shut down through the API (which stops the kernels), then signal the process group."""
        if self.process.poll() is None:
            try:
                self.api("/api/shutdown", "POST")
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except (OSError, ValueError, subprocess.TimeoutExpired):  # not answering: signal it
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                break
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue


def start_lab(root: Path, workdir: Path, env: Mapping[str, str],
              command: Callable[[list[str]], list[str]] = lab_command,
              cwd: Path | None = None) -> LabServer:
    """Start ``pdm run lab``'s command (or ``command``) on ``root`` with a fresh token, in ``cwd``;
    return once the API answers.

    ``env`` is added to this process's environment; Jupyter's own folders go under ``workdir``.
    """
    token, port = secrets.token_hex(24), free_port()
    server_env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN", "MPLBACKEND")}
    # MPLBACKEND is dropped because the nbval conftest sets agg, which would hide every plot.
    server_env.update(env)
    server_env.update({
        NOTEBOOKS_ENV: str(root),
        "JUPYTER_TOKEN": token,
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
    })
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NOTEBOOKS_ENV, str(root))
        argv = command(["--no-browser", f"--port={port}"])
    log = workdir / "jupyterlab.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=server_env, cwd=cwd, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, log, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if server.api("/api/status")[0] == 200:
                return server
        except OSError:  # not listening yet
            pass
        time.sleep(0.25)
    server.stop()
    pytest.fail(f"JupyterLab did not answer within {START_TIMEOUT_S} s:\n{server.log_tail()}")
