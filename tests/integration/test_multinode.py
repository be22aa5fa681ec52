"""Jobs launched from outside Lightning, as on several nodes: two torchrun "nodes" on
localhost that must share one run directory, and the launch check that stops a job whose
ranks could not meet before the Trainer starts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from helpers.train_run import ROOT, read_audit
from odb_lightning.app.validation import check_launch_environment
from odb_lightning.core.order import epoch_permutation
from odb_lightning.runtime.errors import MetadataChannelError

UNRESOLVABLE = "trainer-7f9c4d-0.invalid"  # RFC 6761: never resolves
ALIGNMENT_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This environment without the variables of a launcher the tests may run under."""
    prefixes = ("SLURM_", "TORCHELASTIC_", "GLOO_SOCKET", "NCCL_SOCKET")
    names = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith(prefixes)}
    return {**env, **extra}


def test_two_torchrun_nodes_write_one_run_dir(tmp_path: Path) -> None:
    # No hydra.run.dir: each node resolves conf/train.yaml's own, relative to the cwd.
    port = free_port()
    logs = [tmp_path / f"node{node}.log" for node in (0, 1)]
    nodes = []
    for node, log in enumerate(logs):
        command = [
            *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"),
            *("--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"),
            *(str(ROOT / "train.py"), "debug=smoke", "logger=csv", "audit_ids=true"),
            *("trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"),
        ]
        with log.open("w") as out:  # a file, not a pipe: nothing waits for a reader
            nodes.append(
                subprocess.Popen(
                    command, cwd=tmp_path, env=launcher_free_env(), stdout=out, stderr=out
                )
            )
    try:
        for node in nodes:
            node.wait(timeout=240)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=30)
    for node, log in zip(nodes, logs, strict=True):
        assert node.returncode == 0, f"{log.name}:\n{log.read_text()[-6000:]}"

    (run_dir,) = (tmp_path / "outputs" / "train").iterdir()  # one job, one directory
    datetime.strptime(run_dir.name, "%Y-%m-%d_%H-%M-%S")  # rank 0's clock, as ${now:} was
    assert {"emitted_ids_rank0.jsonl", "emitted_ids_rank1.jsonl", "summary.json"} <= {
        p.name for p in run_dir.iterdir()
    }
    summary = json.loads((run_dir / "summary.json").read_text())
    audit = read_audit(run_dir, 2)
    assert len(audit[0]) == len(audit[1]) == summary["steps_per_rank"] > 0
    emitted = sorted(i for rank in audit for step in rank for i in step)
    # debug=smoke: 80 records, a seeded 16 held out for validation, the other 64 once each.
    assert emitted == sorted(epoch_permutation(80, 0, -1)[16:])
    assert summary["world_size"] == 2 and summary["emitted_samples"] == 64


def run_externally(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """train.py as rank 0 of a 2-rank job some launcher started (no torchrun): its wall s."""
    ranks = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(free_port())}
    command = [
        sys.executable,
        "train.py",
        "debug=smoke",
        "trainer=ddp_cpu",
        "trainer.devices=1",
        "trainer.num_nodes=2",
        f"batching.alignment_timeout_s={ALIGNMENT_TIMEOUT_S}",
        f"hydra.run.dir={tmp_path}",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=launcher_free_env(**ranks, **env),
        capture_output=True,
        text=True,
        timeout=4 * ALIGNMENT_TIMEOUT_S,
        check=False,
    )
    return done, time.perf_counter() - started


def test_unresolvable_master_addr_fails_before_training(tmp_path: Path) -> None:
    done, wall_s = run_externally(tmp_path, MASTER_ADDR=UNRESOLVABLE)
    assert done.returncode != 0
    assert wall_s < ALIGNMENT_TIMEOUT_S  # startup and the check, not a timeout waited out
    assert f"MASTER_ADDR {UNRESOLVABLE!r} does not resolve on this node" in done.stderr
    assert "set MASTER_ADDR" in done.stderr
    assert "Initializing distributed" not in done.stdout + done.stderr  # before the Trainer


@pytest.mark.parametrize(
    "env",
    [
        {},  # one process
        {"WORLD_SIZE": "1", "MASTER_ADDR": UNRESOLVABLE, "MASTER_PORT": "29500"},
        # srun without MASTER_ADDR: Lightning derives it from SLURM_NODELIST later.
        {"SLURM_PROCID": "3", "SLURM_NTASKS": "16", "GLOO_SOCKET_IFNAME": "nonexistent0"},
        {"WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"},
        {
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "GLOO_SOCKET_IFNAME": "lo",
        },
    ],
)
def test_launch_check_passes(env: dict[str, str]) -> None:
    check_launch_environment(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "2", "MASTER_PORT": "29500"}, r"MASTER_ADDR=None and MASTER_PORT='29500'"),
        (
            {"WORLD_SIZE": "2", "MASTER_ADDR": UNRESOLVABLE, "MASTER_PORT": "29500"},
            rf"MASTER_ADDR '{UNRESOLVABLE}' does not resolve",
        ),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "2",
                "MASTER_ADDR": UNRESOLVABLE,
                "MASTER_PORT": "29500",
            },
            r"set MASTER_ADDR",
        ),
        (
            {
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
                "GLOO_SOCKET_IFNAME": "nonexistent0",
            },
            r"GLOO_SOCKET_IFNAME names \['nonexistent0'\].*set GLOO_SOCKET_IFNAME to one of them",
        ),
        (
            {
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
                "GLOO_SOCKET_IFNAME": "lo,nonexistent0",
            },
            r"set GLOO_SOCKET_IFNAME to one of them",
        ),
        (
            {
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
                "NCCL_SOCKET_IFNAME": "=nonexistent0",
            },
            r"set GLOO_SOCKET_IFNAME to the interface",
        ),
    ],
)
def test_launch_check_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(MetadataChannelError, match=message):
        check_launch_environment(env)
