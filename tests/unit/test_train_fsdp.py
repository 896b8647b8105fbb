"""The FSDP2 training script (scripts/train_fsdp.py): two "nodes" of one process each, joined
through torchrun's c10d rendezvous on 127.0.0.1, train as one process does; bad input is a clear
error before any process group exists. Lesson 19 runs the rest (2 processes: reduce dtypes, fp16
with a GradScaler, memory per rank, a sharded checkpoint resumed exactly) in every configuration.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.support import SCRIPTS, load_program

train_fsdp = load_program("train_fsdp")
main = train_fsdp.main

STEPS = 6
RUN = ["--preset", "smoke", "--device", "cpu", "--param-dtype", "fp32", "--steps", str(STEPS)]
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_train_as_one_process_does(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-node command lesson 19 shows, with 2 nodes of 1 process on this machine: each
    node trains on half of every batch, FSDP2 averages the gradients, so in fp32 the losses are
    those of one process on the whole batch, to float32's rounding."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "test-two-nodes",
         str(SCRIPTS / "train_fsdp.py"), *RUN, "--summary", str(tmp_path / f"node{i}.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    two = json.loads(next(tmp_path.glob("node*.json")).read_text())  # rank 0's node wrote it
    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert main([*RUN, "--summary", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert len(two["losses"]) == len(one["losses"]) == STEPS
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert two["losses"][-1] < two["losses"][0]
    # each of the two processes held half of the state the single process held
    halves = [sum(held.values()) for held in two["state_bytes"]]
    assert sum(halves) == sum(one["state_bytes"][0].values())
    assert max(halves) < 0.51 * sum(halves)


def test_resuming_at_or_past_the_last_step_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "train_state.json").write_text(json.dumps({"step": 6, "scaler": {}}))
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "smoke", "--steps", "6", "--resume", str(tmp_path)])
    assert exc.value.code == 2
    assert "is at step 6: pass a --steps beyond it" in capsys.readouterr().err
    assert not dist.is_initialized()


@pytest.mark.parametrize(("args", "environ", "message"), [
    (["--preset", "smoke", "--steps", "0"], {}, "--steps must be at least 1"),
    (["--preset", "smoke", "--reduce-dtype", "int8"], {}, "invalid choice"),
    (["--preset", "smoke", "--resume", "/nonexistent"], {}, "no train_state.json there"),
    (["--preset", "smoke", "--steps", "4", "--save-at", "5"], {}, "the checkpoint would never"),
    (["--preset", "smoke", "--device", "cpu", "--param-dtype", "bf16", "--inf-at", "2"], {},
     "--inf-at needs --param-dtype fp16"),
    (["--preset", "smoke", "--device", "cpu"],
     {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3"}, "does not split over 3 processes"),
])
def test_bad_input_is_a_clear_error(args: list[str], environ: dict[str, str], message: str,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not dist.is_initialized()
