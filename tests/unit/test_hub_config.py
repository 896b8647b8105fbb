"""The workshop hub's settings, without Docker: the GPU rules (docker/hub/hub_gpus.py), the
learners' preset (docker/hub/hub_presets.py), the configuration as JupyterHub loads it, and its
compose file (the compose spec's schema and `docker compose config`, which needs only the compose
CLI); hadolint reads the hub's Dockerfile in test_docker_config.py. The real hub with real
learners is tests/e2e/test_hub.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from typing import Any

import pytest
from traitlets.config import Config

from amp_tutorial import presets
from tests.support.docker_env import (
    HUB_COMPOSE,
    HUB_DIR,
    clean_env,
    hub_compose_command,
    run,
)


def load_hub_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, HUB_DIR / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hub_gpus = load_hub_module("hub_gpus")
hub_presets = load_hub_module("hub_presets")


def load_hub_config(monkeypatch: pytest.MonkeyPatch, **env: str) -> Config:
    """jupyterhub_config.py as JupyterHub loads it, with these settings in the environment."""
    for name in [n for n in os.environ if n.startswith("AMP_HUB_")]:
        monkeypatch.delenv(name)
    for name, value in {"AMP_HUB_ADMIN": "teacher", "AMP_HUB_IMAGE": "amp-tutorial:cpu",
                        "AMP_HUB_NETWORK": "amp-hub", "AMP_TUTORIAL_VARIANT": "cpu",
                        **env}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(HUB_DIR))
    for module in ("hub_gpus", "hub_presets", "amp_progress", "amp_progress.access"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    # The hub image has NativeAuthenticator; the test environment does not need it: the config
    # only asks where its templates are.
    monkeypatch.setitem(sys.modules, "nativeauthenticator", types.SimpleNamespace(
        __file__="/opt/hub/site-packages/nativeauthenticator/__init__.py"))
    config = Config()
    source = (HUB_DIR / "jupyterhub_config.py").read_text()
    exec(compile(source, "jupyterhub_config.py", "exec"), {"get_config": lambda: config})
    return config


def test_each_learner_gets_the_least_used_gpu() -> None:
    assigned: list[str] = []
    for _ in range(5):
        assigned.append(hub_gpus.least_used(["0", "1"], assigned))
    assert assigned == ["0", "1", "0", "1", "0"]
    assert hub_gpus.least_used(["0", "1", "2"], ["0", "0", "2"]) == "1"


def test_gpus_are_passed_the_way_each_vendor_documents() -> None:
    one_nvidia = hub_gpus.host_config("nvidia", "2", ["video", "render"])
    assert one_nvidia["device_requests"] == [
        {"Driver": "nvidia", "Capabilities": [["gpu"]], "DeviceIDs": ["2"]}]
    assert hub_gpus.host_config("nvidia", None, [])["device_requests"][0]["Count"] == -1
    one_amd = hub_gpus.host_config("amd", "renderD136", ["44", "109"])
    assert one_amd["devices"] == ["/dev/kfd:/dev/kfd:rwm",
                                  "/dev/dri/renderD136:/dev/dri/renderD136:rwm"]
    assert one_amd["group_add"] == ["44", "109"]
    assert hub_gpus.host_config("amd", None, [])["devices"][1].startswith("/dev/dri:")
    assert hub_gpus.host_config(None, None, []) == {}


def test_gpu_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="needs a GPU image"):
        hub_gpus.parse_mode("all", None)
    with pytest.raises(ValueError, match="expected one of"):
        hub_gpus.parse_mode("some", "nvidia")
    with pytest.raises(ValueError, match="AMP_HUB_GPU_IDS"):
        hub_gpus.least_used([], [])
    assert hub_gpus.parse_mode(None, "amd") == "all"
    assert hub_gpus.parse_mode(None, None) == "none"


def test_the_hub_knows_the_courses_preset_names() -> None:
    """The hub image has no amp_tutorial (it would bring torch), so hub_presets.py keeps the
    names itself: they must be the course's."""
    assert sorted(hub_presets.NAMES) == sorted(presets.VALID_NAMES), (
        "docker/hub/hub_presets.py NAMES must equal amp_tutorial.presets.VALID_NAMES")


def test_learners_sharing_gpus_get_a_smaller_preset_by_default() -> None:
    shared = hub_presets.SHARED_GPU_PRESET
    assert hub_presets.learner_preset(None, "all") == shared
    assert hub_presets.learner_preset("", "all") == shared  # compose passes unset as empty
    # smaller than the GPU size, so a class on one GPU does not run it out of memory
    assert shared in presets.PRESETS and shared != "paper"
    small, paper = presets.PRESETS[shared], presets.PRESETS["paper"]
    assert small.grid < paper.grid and small.hidden < paper.hidden
    # the transformer's activations grow with tokens x width x layers, its weights with layers
    t, p = small.transformer, paper.transformer
    def activations(sizes: presets.TransformerSizes) -> int:
        return sizes.batch * sizes.seq_len * sizes.d_model * sizes.n_layers
    assert activations(t) < activations(p)
    assert t.d_model <= p.d_model and t.n_layers < p.n_layers
    for mode in ("each", "none"):  # a GPU to themselves (or a CPU): the device decides
        assert hub_presets.learner_preset(None, mode) == "auto"


def test_a_preset_the_instructor_names_wins() -> None:
    for mode in hub_gpus.MODES:
        assert hub_presets.learner_preset("smoke", mode) == "smoke"
    assert hub_presets.learner_preset("paper", "all") == "paper"  # they may choose the big one
    assert hub_presets.learner_preset(" Auto ", "all") == "auto"  # as the course reads it


def test_an_unknown_preset_is_refused_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match="AMP_HUB_PRESET='huge'") as refused:
        hub_presets.learner_preset("huge", "all")
    assert f"valid names: {', '.join(hub_presets.NAMES)}" in str(refused.value)


def test_config_admits_nobody_by_itself_and_isolates_learners(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = load_hub_config(monkeypatch, AMP_HUB_PREFIX="ws", AMP_HUB_MEM_LIMIT="3G",
                        AMP_HUB_IDLE_TIMEOUT="900")
    assert c.JupyterHub.authenticator_class == "nativeauthenticator.NativeAuthenticator"
    assert c.NativeAuthenticator.open_signup is False
    assert c.Authenticator.admin_users == {"teacher"}
    assert c.DockerSpawner.volumes == {"ws-{username}": "/home/learner/work"}
    assert c.DockerSpawner.name_template == "ws-{username}"
    assert c.DockerSpawner.mem_limit == "3G" and c.DockerSpawner.cpu_limit == 4.0
    # torch's threads: one per core of the learner's limit, not of the host
    assert c.DockerSpawner.environment["OMP_NUM_THREADS"] == "4"
    assert load_hub_config(monkeypatch, AMP_HUB_CPU_LIMIT="0.5").DockerSpawner.environment[
        "OMP_NUM_THREADS"] == "1"
    services = {service["name"]: service for service in c.JupyterHub.services}
    assert "--timeout=900" in services["idle-culler"]["command"]
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert roles["idle-culler"]["services"] == ["idle-culler"]
    assert "delete:servers" in roles["idle-culler"]["scopes"]


def test_the_spawn_hook_hands_out_gpus_and_takes_them_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = load_hub_config(monkeypatch, AMP_TUTORIAL_VARIANT="cuda", AMP_HUB_GPUS="each",
                        AMP_HUB_GPU_IDS="0,1")
    assert c.JupyterHub.template_paths == ["/opt/hub/site-packages/nativeauthenticator/templates"]

    def spawner(name: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(user=types.SimpleNamespace(name=name),
                                     log=types.SimpleNamespace(info=lambda *args: None))

    def gpu_of(learner: types.SimpleNamespace) -> list[str]:
        [request] = learner.extra_host_config["device_requests"]
        return request["DeviceIDs"]

    ada, bob, eve = spawner("ada"), spawner("bob"), spawner("eve")
    for learner in (ada, bob):
        c.Spawner.pre_spawn_hook(learner)
    assert (gpu_of(ada), gpu_of(bob)) == (["0"], ["1"])
    c.Spawner.post_stop_hook(ada)
    c.Spawner.pre_spawn_hook(eve)
    assert gpu_of(eve) == ["0"]  # ada's GPU, free again


def test_config_refuses_each_gpu_mode_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="AMP_HUB_GPU_IDS"):
        load_hub_config(monkeypatch, AMP_TUTORIAL_VARIANT="cuda", AMP_HUB_GPUS="each")


def test_config_passes_the_preset_to_every_learners_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def preset(**env: str) -> str:
        environment = load_hub_config(monkeypatch, **env).DockerSpawner.environment
        assert environment["AMP_TUTORIAL_WORK"] == "/home/learner/work"
        return environment["AMP_TUTORIAL_PRESET"]

    assert preset(AMP_TUTORIAL_VARIANT="cuda") == hub_presets.SHARED_GPU_PRESET  # `all`
    assert preset(AMP_TUTORIAL_VARIANT="rocm", AMP_HUB_GPUS="each",
                  AMP_HUB_GPU_IDS="renderD128") == "auto"
    assert preset() == "auto"  # the cpu variant: AMP_HUB_GPUS=none
    assert preset(AMP_TUTORIAL_VARIANT="cuda", AMP_HUB_PRESET="smoke") == "smoke"


def test_config_refuses_an_unknown_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="valid names: auto"):
        load_hub_config(monkeypatch, AMP_HUB_PRESET="huge")


def test_config_without_an_admin_stops_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="AMP_HUB_ADMIN"):
        load_hub_config(monkeypatch, AMP_HUB_ADMIN="")


def test_hub_compose_file_is_valid_and_closed_by_default(compose_cli: None) -> None:
    result = run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                  "vendor.compose-spec", HUB_COMPOSE], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    config = json.loads(run([*hub_compose_command("amp-hub"), "config", "--format", "json"],
                            env=clean_env(AMP_HUB_ADMIN="teacher")).stdout)["services"]
    assert [(p["host_ip"], p["published"]) for p in config["hub"]["ports"]] == [
        ("127.0.0.1", "8000")]
    assert config["course"]["image"] == "amp-tutorial:rocm"
    assert config["hub"]["environment"]["AMP_HUB_IMAGE"] == "amp-tutorial:rocm"
    assert config["hub"]["environment"]["AMP_HUB_PRESET"] == ""  # unset: the hub's default
    assert config["hub"]["logging"] == {  # the hub's log is rotated: it cannot fill the disk
        "driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}
    chosen = json.loads(run([*hub_compose_command("amp-hub"), "config", "--format", "json"],
                            env=clean_env(AMP_HUB_ADMIN="teacher", AMP_HUB_PRESET="smoke"),
                            ).stdout)["services"]["hub"]["environment"]
    assert chosen["AMP_HUB_PRESET"] == "smoke"
    unset = run([*hub_compose_command("amp-hub"), "config"], env=clean_env(), check=False)
    assert unset.returncode != 0 and "set AMP_HUB_ADMIN" in unset.stderr


def test_learners_servers_may_post_attempts_and_only_the_admin_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress service's grants (docker/hub/amp_progress/access.py): the servers' tokens get
    the default `server` scopes plus the post scope, nothing else; the read scope goes to the
    admin's role alone, and the service's OAuth tokens may carry it."""
    c = load_hub_config(monkeypatch)
    post, read = "custom:amp-progress:post", "custom:amp-progress:read"
    assert set(c.JupyterHub.custom_scopes) == {post, read}
    assert c.Spawner.server_token_scopes == ["users:activity!user", "access:servers!server", post]
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert roles["user"]["scopes"] == ["self", post]
    instructor = roles["amp-progress-instructor"]
    assert instructor["users"] == ["teacher"] and read in instructor["scopes"]
    assert [name for name, role in roles.items() if read in role["scopes"]] == [
        "amp-progress-instructor"]
    service = {s["name"]: s for s in c.JupyterHub.services}["amp-progress"]
    assert service["oauth_client_allowed_scopes"] == [read]
    assert service["environment"]["AMP_PROGRESS_DB"].startswith("/srv/jupyterhub/")  # the volume
    assert service["command"][-2:] == ["-m", "amp_progress"]
    assert service["environment"]["PYTHONPATH"] == "/etc/jupyterhub"
    copied = (HUB_DIR / "Dockerfile").read_text()  # the package, course.json included
    assert "COPY docker/hub/amp_progress/ /etc/jupyterhub/amp_progress/" in copied
    url = c.DockerSpawner.environment["AMP_PROGRESS_URL"]
    assert url == "http://hub:8000/services/amp-progress/api/attempts"
    assert c.DockerSpawner.environment["AMP_TUTORIAL_WORKSPACE"] == "/home/learner/work"
