"""The DDP training script (scripts/train_ddp.py): 2 Gloo processes on CPU under torchrun, 1 process
without it, bad input, and the AMP lines lesson 11 shows, in the order that is right."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from amp_tutorial.checkpoint import load_checkpoint, parameter_hash
from amp_tutorial.models import ConvModel
from amp_tutorial.presets import get_preset
from tests.support import SCRIPTS, load_program

train_ddp = load_program("train_ddp")
main = train_ddp.main

SMOKE = ["--preset", "smoke", "--device", "cpu"]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One torchrun launch of 2 CPU processes (standalone: a free port is picked per run)."""
    out = tmp_path_factory.mktemp("ddp2")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(SCRIPTS / "train_ddp.py"), *SMOKE,
               "--checkpoint", str(out / "model.pt"), "--summary", str(out / "summary.json")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    return {"summary": summary, "stdout": proc.stdout, "checkpoint": out / "model.pt"}


def test_all_ranks_end_with_identical_parameters(two_processes: dict) -> None:
    summary = two_processes["summary"]
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    assert summary["amp_dtype"] == "bf16" and not summary["grad_scaler"]
    assert len(summary["param_hashes"]) == 2
    assert summary["param_hashes"][0] == summary["param_hashes"][1]


def test_loss_went_down(two_processes: dict) -> None:
    summary = two_processes["summary"]
    assert len(summary["losses"]) == summary["steps"] > 1
    assert summary["epoch_losses"][-1] < 0.8 * summary["epoch_losses"][0]


def test_only_rank_0_prints_and_its_checkpoint_holds_the_shared_parameters(
        two_processes: dict) -> None:
    assert two_processes["stdout"].count("DDP: 2 process(es)") == 1
    assert two_processes["stdout"].count("epoch 1/") == 1
    preset = get_preset("smoke")
    model = ConvModel(preset.hidden, preset.n_hidden_layers)
    extra = load_checkpoint(two_processes["checkpoint"], model)
    assert extra["world_size"] == 2 and extra["step"] == two_processes["summary"]["steps"]
    assert parameter_hash(model) == two_processes["summary"]["param_hashes"][0]


def test_single_process_without_torchrun(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert main([*SMOKE, "--summary", str(tmp_path / "summary.json")]) == 0
    assert not dist.is_initialized()  # the process group was destroyed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 1 and len(summary["param_hashes"]) == 1
    assert summary["epoch_losses"][-1] < summary["epoch_losses"][0]


def test_process_group_is_destroyed_on_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):  # the checkpoint's parent is a file: saving fails after training
        main([*SMOKE, "--epochs", "1", "--checkpoint", str(blocker / "model.pt")])
    assert not dist.is_initialized()


@pytest.mark.parametrize(("args", "message"), [
    (["--preset", "huge"], "valid names: auto, paper, cpu, small, smoke"),
    ([*SMOKE, "--epochs", "0"], "--epochs must be at least 1"),
    ([*SMOKE, "--dtype", "int8"], "invalid choice"),
    (["--device", "nodevice"], "not a device name"),
])
def test_bad_input_is_a_clear_error(args: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="checks the error on a GPU-less machine")
def test_gpu_device_on_a_cpu_machine_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--device", "cuda"])
    assert "not available on this machine" in capsys.readouterr().err


def test_the_loop_has_the_amp_lines_once_each_in_order() -> None:
    """What lesson 11 teaches from this file: the GradScaler made once per process before the
    loop, set_epoch each epoch, backward outside autocast, step then update; and the process group
    destroyed in a ``finally``."""
    loop = inspect.getsource(train_ddp.train).splitlines()
    taught = ["torch.amp.GradScaler(", "for epoch in", "sampler.set_epoch(epoch)",
              "with torch.autocast(", "scaler.scale(loss).backward()", "scaler.step(optimizer)",
              "scaler.update()"]
    where = {text: [i for i, line in enumerate(loop) if text in line] for text in taught}
    assert all(len(found) == 1 for found in where.values()), where
    assert [where[text][0] for text in taught] == sorted(where[text][0] for text in taught)

    def indent(text: str) -> int:
        line = loop[where[text][0]]
        return len(line) - len(line.lstrip())

    assert indent("scaler.scale(loss).backward()") == indent("with torch.autocast(")
    assert indent("torch.amp.GradScaler(") < indent("sampler.set_epoch(epoch)")
    assert "finally:\n        dist.destroy_process_group()" in inspect.getsource(train_ddp.main)
