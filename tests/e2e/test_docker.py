"""The Docker image end to end: real builds and starts on the base layouts (the Dockerfile's and
compose's static checks are tests/unit/test_docker_config.py).

The end-to-end tests need a Docker engine with Compose v2 and the local test base image (`.ci/run`
provides all three; tests/support/docker_env.py says how the base is made, and makes the stand-ins
for the real bases' layouts on it, LAYOUTS). The course image is then built through compose with
BASE_IMAGE pointing at a layout, exactly as a user's `docker compose up` builds it, and started
under a unique project name on a free port, with a copy of notebooks/ as the bind mount. Everything
the tests start is removed afterwards, also when a test fails. Outside CI, a missing tool skips
these tests; under CI=true it fails them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jupytext
import pytest

from amp_tutorial import versions
from course_tools.catalogue import lesson_paths
from tests.support import NOTEBOOKS, ROOT, runnable_lesson
from tests.support.docker_env import (
    HOST_RENDER_GID,
    IMAGE_RENDER_GID,
    LAYOUTS,
    compose_command,
    compose_env,
    host_ca_bundle,
    layout_image,
    missing,
    run,
)
from tests.support.lab_server import free_port

pytestmark = pytest.mark.docker

LAB_OVERRIDES = ROOT / "jupyter-config/etc/jupyter/labconfig/default_setting_overrides.json"
LESSON = lesson_paths(NOTEBOOKS)[0]  # the one the edit tests change
RUN_LESSON = runnable_lesson()  # one without an exercise stub, run as a learner has it
# Distributions the base image provides; the course venv must not install its own.
NOT_FROM_LOCK = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# End to end: build the CPU variant on each base layout, start it, probe it
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Lab:
    """A running compose project of the CPU variant on one layout, and ways to talk to it."""

    project: str
    env: dict[str, str]
    port: int
    uid: int
    gid: int
    notebooks: Path
    base_image: str
    token: str = ""
    override: Path | None = None  # a compose file merged over docker-compose.yml

    def compose(self, *args: str, timeout: float = 300, check: bool = True,
                ) -> subprocess.CompletedProcess[str]:
        override = ["--file", self.override] if self.override else []
        return run([*compose_command(self.project), *override, *args], env=self.env,
                   timeout=timeout, check=check)

    def exec(self, *args: str, timeout: float = 120, check: bool = True,
             ) -> subprocess.CompletedProcess[str]:
        return self.compose("exec", "-T", "lab", *args, timeout=timeout, check=check)

    def up(self) -> None:
        result = self.compose("up", "--detach", "--wait", "--wait-timeout", "180", check=False,
                              timeout=300)
        if result.returncode != 0:
            logs = self.compose("logs", "lab", check=False).stdout
            pytest.fail(f"the lab did not turn healthy:\n{result.stderr[-2000:]}\n{logs[-4000:]}")
        self.token = self.printed_token()

    def container(self) -> dict[str, Any]:
        container_id = self.compose("ps", "--quiet", "lab").stdout.strip()
        return json.loads(run(["docker", "inspect", container_id]).stdout)[0]

    def printed_token(self) -> str:
        """The generated token, from the URL the entry point prints."""
        found = re.findall(r"/lab\?token=([0-9a-f]+)", self.compose("logs", "lab").stdout)
        assert found, "the lab printed no URL with a token"
        return found[-1]

    def request(self, method: str, path: str, body: Any = None, token: str | None = "",
                ) -> tuple[int, Any]:
        """A request through the published port, with the lab's token unless one is given (None:
        no token); returns (status, decoded JSON)."""
        headers = {"Content-Type": "application/json"}
        token = self.token if token == "" else token
        if token:
            headers["Authorization"] = f"token {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         headers=headers, method=method)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, None

    def processes(self) -> list[tuple[int, str]]:
        """(uid, command line) of every process in the container, except ``runc init``: the
        runtime's bootstrap of a ``docker exec`` or of the image's HEALTHCHECK (every 5 s), which
        runs as root for a moment inside the container before it becomes the container's user
        and the command; a listing that catches one is not the course running as root."""
        listing = self.exec("python", "-c", LIST_PROCESSES).stdout
        return [(int(uid), command) for uid, command in
                (line.split(" ", 1) for line in listing.splitlines()) if command != "runc init"]


# Prints "uid command line" for every process in the container.
LIST_PROCESSES = """
import pathlib
for proc in pathlib.Path("/proc").glob("[0-9]*"):
    try:
        status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
        command = (proc / "cmdline").read_bytes().replace(b"\\0", b" ").decode()
    except OSError:  # gone meanwhile
        continue
    print(status["Uid"].split()[0], " ".join(command.split()))
"""


class Labs:
    """The labs of this module, one per layout: built and started on first use, and all stopped
    and removed (images included) at the end, also when a build or start failed."""

    def __init__(self, base_image: str, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.base_image = base_image
        self.tmp_path_factory = tmp_path_factory
        self.started: dict[str, Lab] = {}
        self.failed: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    def get(self, name: str) -> Lab:
        if name in self.failed:
            pytest.fail(f"the {name} layout's lab failed to start earlier: {self.failed[name]}")
        if name not in self.started:
            began = time.monotonic()
            try:
                self.started[name] = lab = self._create(name)
                lab.compose("build", timeout=1800)
                lab.up()
            except BaseException as error:
                self.failed[name] = str(error)[:2000]
                raise
            self.timings[name] = time.monotonic() - began
        return self.started[name]

    def _create(self, name: str) -> Lab:
        layout = LAYOUTS[name]
        image = layout_image(self.base_image, layout)
        # The bind mount gets a copy of notebooks/, so the tests never edit the checkout. It
        # belongs to the user running the tests, whose UID/GID the image gets; as root the test
        # stands in the layout's UID for itself, since the lab never runs as root.
        uid, gid = ((os.getuid(), os.getgid()) if os.getuid() != 0
                    else (layout.root_uid, layout.root_uid))
        notebooks = self.tmp_path_factory.mktemp(f"notebooks-{name}")
        shutil.copytree(ROOT / "notebooks", notebooks, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints",
                                                      "__pycache__"))
        if os.getuid() == 0:
            for path in [notebooks, *notebooks.rglob("*")]:
                os.chown(path, uid, gid)
        project = f"amp-tutorial-test-{name}-{secrets.token_hex(4)}"
        settings = {
            "AMP_TUTORIAL_VARIANT": "cpu", "BASE_IMAGE": image, "AMP_TUTORIAL_IMAGE": project,
            "AMP_TUTORIAL_PORT": str(free_port()), "NB_UID": str(uid), "NB_GID": str(gid),
            "AMP_TUTORIAL_NOTEBOOKS": str(notebooks),
        }
        if ca_bundle := host_ca_bundle():
            settings["AMP_TUTORIAL_CA_BUNDLE"] = ca_bundle
        return Lab(project, compose_env(**settings), int(settings["AMP_TUTORIAL_PORT"]), uid, gid,
                   notebooks, image)

    def remove_all(self) -> None:
        for lab in self.started.values():
            lab.compose("down", "--volumes", "--rmi", "all", "--remove-orphans", check=False)


@pytest.fixture(scope="module")
def labs(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Labs]:
    labs = Labs(base_image, tmp_path_factory)
    try:
        yield labs
    finally:
        labs.remove_all()
        # Build and start time per layout: what these tests add to a CI run.
        print("\nlab build+start:", ", ".join(f"{k} {v:.0f} s" for k, v in labs.timings.items()))


@pytest.fixture(params=list(LAYOUTS))
def lab(request: pytest.FixtureRequest, labs: Labs) -> Lab:
    """The lab on each layout in turn (tests that hold on every base image)."""
    return labs.get(request.param)


@pytest.fixture
def rocm_lab(labs: Labs) -> Lab:
    """The lab on the rocm/pytorch layout (tests of what does not depend on the base)."""
    return labs.get("rocm")


@pytest.fixture(scope="module")
def host_gpu_files() -> Iterator[dict[str, Path]]:
    """Stand-ins for a ROCm host's /dev/kfd and /dev/dri/renderD128, keyed by those paths:
    character devices (with /dev/null's numbers: harmless) of group HOST_RENDER_GID, mode 0660,
    as udev makes them. Docker gives a passed device file the host file's owner and mode."""
    if os.geteuid() != 0:
        missing("the stand-in GPU device files need root (mknod)")
    with tempfile.TemporaryDirectory(prefix="amp-tutorial-devices-") as folder:
        files = {"/dev/kfd": Path(folder, "kfd"), "/dev/dri/renderD128": Path(folder, "renderD128")}
        for path in files.values():
            os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
            os.chown(path, 0, HOST_RENDER_GID)
            path.chmod(0o660)  # mknod applied the umask
        yield files


# --- on every layout --------------------------------------------------------------------------

def test_container_turns_healthy(lab: Lab) -> None:
    container = lab.container()
    assert container["State"]["Health"]["Status"] == "healthy"
    probe = " ".join(container["Config"]["Healthcheck"]["Test"])
    # the server's API, below the hub's URL prefix when the hub started it (/ here)
    assert "JUPYTERHUB_SERVICE_PREFIX', '/') + 'api'" in probe, probe


def test_api_answers_only_with_the_token(lab: Lab) -> None:
    status, body = lab.request("GET", "/api/status")
    assert status == 200 and "started" in body
    assert lab.request("GET", "/api/status", token=None)[0] == 403
    assert lab.request("GET", "/api/status", token="not-the-token")[0] == 403


def test_lab_runs_as_the_host_user_not_root(lab: Lab) -> None:
    processes = lab.processes()
    assert any("jupyterlab" in command for _, command in processes), processes
    assert {uid for uid, _ in processes} == {lab.uid}, processes


def test_torch_is_the_base_images_own(lab: Lab) -> None:
    probe = "import torch; print(torch.__version__, torch.__file__)"
    in_base = run(["docker", "run", "--rm", lab.base_image, "python", "-c", probe]).stdout.split()
    in_lab = lab.exec("python", "-c", probe).stdout.split()
    assert in_lab == in_base
    assert not in_lab[1].startswith("/opt/course/")
    installed = lab.exec("python", "-c", (
        "import importlib.metadata as md, sysconfig\n"
        "for d in md.distributions(path=[sysconfig.get_path('purelib')]):\n"
        "    print(d.metadata['Name'])\n")).stdout.split()
    assert "jupyterlab" in installed and "amp-tutorial" in installed
    assert [name for name in installed if NOT_FROM_LOCK.match(name)] == []


def test_torchao_is_the_release_for_the_bases_torch(lab: Lab) -> None:
    # the lock's torchao (0.18) does not import on the bases' torch 2.9; the build picks by torch
    probe = ("import importlib.metadata as md, torch; import torchao; "
             "print(torch.__version__, md.version('torchao'))")
    torch_version, torchao_version = lab.exec("python", "-c", probe).stdout.split()[-2:]
    assert torchao_version == versions.torchao_for(torch_version), (torch_version, torchao_version)
    assert torch_version.startswith(versions.DOCKER_TEST_TORCH)  # the CUDA variant's base


def test_notebook_executes_in_the_container_at_the_smoke_preset(lab: Lab) -> None:
    lab.exec("env", "AMP_TUTORIAL_PRESET=smoke", "jupytext", "--execute", "--to", "ipynb",
             "--output", "/tmp/executed.ipynb", RUN_LESSON.name, timeout=600)
    executed = json.loads(lab.exec("cat", "/tmp/executed.ipynb").stdout)
    code_cells = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code_cells and all(c["execution_count"] for c in code_cells)
    assert not [o for c in code_cells for o in c["outputs"] if o["output_type"] == "error"]


def test_an_edit_lands_on_the_host_owned_by_the_host_user(lab: Lab) -> None:
    marker = f"Edited in the container ({secrets.token_hex(4)})"
    status, model = lab.request("GET", f"/api/contents/{LESSON.name}?type=notebook&content=1")
    notebook = model["content"]
    notebook["cells"].append({"cell_type": "markdown", "id": secrets.token_hex(4),
                              "metadata": {}, "source": marker})
    saved, _ = lab.request("PUT", f"/api/contents/{LESSON.name}",
                           {"type": "notebook", "format": "json", "content": notebook})
    created, _ = lab.request("PUT", "/api/contents/notes.txt",
                             {"type": "file", "format": "text", "content": marker})
    assert (saved, created) == (200, 201)
    assert marker in (lab.notebooks / LESSON.name).read_text()  # saved as py:percent
    stat_result = (lab.notebooks / "notes.txt").stat()
    assert (stat_result.st_uid, stat_result.st_gid) == (lab.uid, lab.gid)


def test_torchrun_runs_the_course_in_the_container(lab: Lab) -> None:
    # The README's command, as written: the base's own torchrun would start workers with the
    # base's Python, which cannot import amp_tutorial.
    result = lab.exec("torchrun", "--nproc-per-node", "2", "/home/learner/scripts/train_ddp.py",
                      "--preset", "smoke", "--device", "cpu", timeout=600)
    assert "DDP: 2 process(es), backend gloo" in result.stdout, result.stdout + result.stderr


def test_terminal_runs_bash(lab: Lab) -> None:
    before = {command for _, command in lab.processes()}
    status, terminal = lab.request("POST", "/api/terminals")
    assert status == 200
    try:
        started = [(uid, command) for uid, command in lab.processes() if command not in before]
        assert (lab.uid, "/bin/bash -l") in started, started
    finally:
        lab.request("DELETE", f"/api/terminals/{terminal['name']}")


# --- on one layout: what does not depend on the base --------------------------------------------

def test_empty_token_is_refused(rocm_lab: Lab) -> None:
    result = rocm_lab.compose("run", "--rm", "--no-deps", "--no-TTY", "-e", "JUPYTER_TOKEN=",
                              "lab", check=False)
    assert result.returncode != 0
    assert "JUPYTER_TOKEN is set but empty" in result.stderr


def test_port_is_published_on_loopback_only(rocm_lab: Lab) -> None:
    container = rocm_lab.container()
    bindings = container["NetworkSettings"]["Ports"]["8888/tcp"]
    assert bindings == [{"HostIp": "127.0.0.1", "HostPort": str(rocm_lab.port)}]
    # The same port on another address of this host (the project network's gateway) is closed.
    network = next(iter(container["NetworkSettings"]["Networks"].values()))
    with pytest.raises(OSError):
        socket.create_connection((network["Gateway"], rocm_lab.port), timeout=5).close()


def test_lab_settings_are_in_effect(rocm_lab: Lab) -> None:
    overrides = json.loads(LAB_OVERRIDES.read_text())
    for plugin, settings in overrides.items():
        status, body = rocm_lab.request("GET", f"/lab/api/settings/{plugin}")
        assert status == 200, plugin
        for key, value in settings.items():
            assert body["schema"]["properties"][key]["default"] == value, (plugin, key)


def test_course_notebook_opens_as_a_notebook(rocm_lab: Lab) -> None:
    status, model = rocm_lab.request("GET",
                                     f"/api/contents/{LESSON.name}?type=notebook&content=1")
    assert status == 200
    assert (model["type"], model["format"]) == ("notebook", "json")
    expected = jupytext.read(rocm_lab.notebooks / LESSON.name)  # the lab's copy (edits included)
    assert [c["source"] for c in model["content"]["cells"]] == [c.source for c in expected.cells]


def test_edits_survive_down_and_up(rocm_lab: Lab) -> None:
    marker = f"Kept over down and up ({secrets.token_hex(4)})"
    created, _ = rocm_lab.request("PUT", "/api/contents/kept.txt",
                                  {"type": "file", "format": "text", "content": marker})
    assert created == 201
    rocm_lab.compose("down")
    rocm_lab.up()
    status, model = rocm_lab.request("GET",
                                     "/api/contents/kept.txt?type=file&format=text&content=1")
    assert status == 200 and model["content"] == marker



def test_outputs_survive_restart_and_down_and_up(rocm_lab: Lab) -> None:
    """A lesson saved with an output (as the lab's Save does) is paired on the host's folder: the
    output comes back after `docker compose restart` and after down and up, the .py unchanged."""
    shipped = run(["docker", "run", "--rm", "--entrypoint", "find",
                   f"{rocm_lab.project}:cpu", "/home/learner", "-name", "*.ipynb"]).stdout
    assert not shipped.strip(), f"the image ships notebooks with outputs: {shipped}"
    path = f"/api/contents/{LESSON.name}"
    text = f"a table {secrets.token_hex(4)}\n"
    status, model = rocm_lab.request("GET", f"{path}?type=notebook&content=1")
    assert status == 200
    cell = next(c for c in model["content"]["cells"] if c["cell_type"] == "code")
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": text}]
    before = (rocm_lab.notebooks / LESSON.name).read_bytes()
    status, _ = rocm_lab.request("PUT", path, {"type": "notebook", "format": "json",
                                               "content": model["content"]})
    assert status == 200
    assert (rocm_lab.notebooks / LESSON.name).read_bytes() == before
    assert (rocm_lab.notebooks / LESSON.with_suffix(".ipynb").name).exists()

    def first_output() -> list[str]:
        status, model = rocm_lab.request("GET", f"{path}?type=notebook&content=1")
        assert status == 200
        cell = next(c for c in model["content"]["cells"] if c["cell_type"] == "code")
        return [o.get("text") for o in cell["outputs"]]

    rocm_lab.compose("restart", "lab")
    rocm_lab.up()  # waits until healthy again, reads the new token
    assert first_output() == [text]
    rocm_lab.compose("down")
    rocm_lab.up()
    assert first_output() == [text]

# --- the ROCm variant's device files ------------------------------------------------------------

DESCRIBE_DEVICE = "from amp_tutorial import describe_device; print(describe_device())"


def rocm_variant_of(lab: Lab, override: Path | None = None) -> Lab:
    """The ROCm variant of `lab`'s image (its build is cached) as another project on another
    port, not started."""
    port = free_port()
    env = lab.env | {"AMP_TUTORIAL_VARIANT": "rocm", "AMP_TUTORIAL_PORT": str(port)}
    return dataclasses.replace(lab, project=f"{lab.project}-rocm", env=env, port=port, token="",
                               override=override)


def test_rocm_variant_without_kfd_fails_with_the_message_the_readme_explains(
        rocm_lab: Lab) -> None:
    if Path("/dev/kfd").exists():
        pytest.skip("this machine has /dev/kfd: the ROCm variant can start here")
    variant = rocm_variant_of(rocm_lab)
    try:
        result = variant.compose("up", "--detach", check=False, timeout=600)
    finally:
        variant.compose("down", "--rmi", "all", check=False)
    message = ('error gathering device information while adding custom device "/dev/kfd": '
               'no such file or directory')
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert message in (ROOT / "README.md").read_text()


def test_rocm_variant_names_the_fix_when_device_files_are_closed(
        rocm_lab: Lab, host_gpu_files: dict[str, Path], tmp_path: Path) -> None:
    # The ROCm variant as compose runs it, with the stand-in device files in place of the host's.
    devices = "\n".join(f"      - {host}:{inside}" for inside, host in host_gpu_files.items())
    override = tmp_path / "stand-in-devices.yml"
    override.write_text(f"services:\n  lab:\n    devices: !override\n{devices}\n")
    variant = rocm_variant_of(rocm_lab, override)
    fixed = dataclasses.replace(variant, env=variant.env | {"RENDER_GID": str(HOST_RENDER_GID)})
    try:
        # Compose's default, group_add `render`, names the image's render group: not the host's.
        variant.up()
        render = variant.exec("getent", "group", "render").stdout
        assert render.split(":")[2] == str(IMAGE_RENDER_GID)
        log = variant.compose("logs", "lab").stdout
        line = variant.exec("python", "-c", DESCRIBE_DEVICE).stdout
        for text in (log, line):
            assert f"/dev/kfd (group {HOST_RENDER_GID})" in text, text
            assert f"RENDER_GID={HOST_RENDER_GID} in the .env file" in text, text
        assert "No GPU because" in line
        # The fix the message names: the host's group number in group_add.
        fixed.up()
        log = fixed.compose("logs", "lab").stdout
        line = fixed.exec("python", "-c", DESCRIBE_DEVICE).stdout
        assert "RENDER_GID" not in log and "No GPU" not in line, log + line
        fixed.exec("sh", "-c", "test -r /dev/kfd -a -w /dev/kfd -a -r /dev/dri/renderD128")
    finally:
        fixed.compose("down", "--rmi", "all", check=False)


def setup_env_in(image: str, notebooks: Path, env_file: Path,
                 devices: dict[str, Path] | None = None) -> str:
    """docker/setup-env run in a container of `image`, on `notebooks` and `env_file`, with
    `devices` passed in: as on a host with those device files."""
    device_args = [arg for inside, host in (devices or {}).items()
                   for arg in ("--device", f"{host}:{inside}")]
    return run(["docker", "run", "--rm", *device_args,
                "--volume", f"{ROOT / 'docker'}:/course/docker:ro",
                "--volume", f"{notebooks}:/course/notebooks",
                "--volume", f"{env_file.parent}:/course/out",
                image, "sh", "/course/docker/setup-env", f"/course/out/{env_file.name}"]).stdout


def test_setup_env_picks_cpu_without_a_gpu_and_keeps_other_settings(
        base_image: str, tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    if os.geteuid() == 0:
        os.chown(notebooks, 1000, 1001)
    env_file = tmp_path / "out" / ".env"
    env_file.parent.mkdir()
    env_file.write_text("JUPYTER_TOKEN=kept\nAMP_TUTORIAL_VARIANT=rocm\n")
    output = setup_env_in(base_image, notebooks, env_file)
    owner = notebooks.stat()
    assert env_file.read_text().splitlines() == [
        "JUPYTER_TOKEN=kept", "AMP_TUTORIAL_VARIANT=cpu",
        f"NB_UID={owner.st_uid}", f"NB_GID={owner.st_gid}"], output


def test_setup_env_picks_rocm_and_the_hosts_render_group(
        base_image: str, host_gpu_files: dict[str, Path], tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    os.chown(notebooks, 1000, 1000)
    env_file = tmp_path / "out" / ".env"
    env_file.parent.mkdir()
    output = setup_env_in(base_image, notebooks, env_file, host_gpu_files)
    assert env_file.read_text().splitlines() == [
        "AMP_TUTORIAL_VARIANT=rocm", f"RENDER_GID={HOST_RENDER_GID}", "NB_UID=1000",
        "NB_GID=1000"], output
