"""Jobs launched from outside Lightning, as on several nodes: two torchrun "nodes" (and,
marked slow, two srun tasks) on localhost that must share one run directory, and the
launch check that stops a job whose ranks could not meet before the Trainer starts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from helpers.torchrun import launcher_free_env
from helpers.train_run import ROOT, read_audit
from odb_lightning.app.validation import check_launch_environment
from odb_lightning.core.order import epoch_permutation
from odb_lightning.runtime.errors import MetadataChannelError

UNRESOLVABLE = "trainer-7f9c4d-0.invalid"  # RFC 6761: .invalid names never exist


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_nodes(tmp_path: Path, commands: list[list[str]], envs: list[dict[str, str]]) -> None:
    """Start every process at once in ``tmp_path`` (so that ``outputs/`` lands there) and
    wait for all of them; each one's output goes to a log file, not a pipe."""
    processes = []
    for node, (command, env) in enumerate(zip(commands, envs, strict=True)):
        with (tmp_path / f"node{node}.log").open("w") as log:
            processes.append(
                subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
            )
    try:
        for process in processes:
            process.wait(timeout=600)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    for node, process in enumerate(processes):
        log = (tmp_path / f"node{node}.log").read_text()
        assert process.returncode == 0, f"node {node}:\n{log[-6000:]}"


def assert_one_run_dir(tmp_path: Path) -> Path:
    """The one directory both ranks wrote, with every sample once and equal step counts."""
    (run_dir,) = (tmp_path / "outputs" / "train").iterdir()  # one job, one directory
    assert {"emitted_ids_rank0.jsonl", "emitted_ids_rank1.jsonl", "summary.json"} <= {
        p.name for p in run_dir.iterdir()
    }
    # Each rank's Hydra files apart: nothing written twice into the shared directory.
    assert {".hydra", ".hydra_rank1", "train.log", "train_rank1.log"} <= {
        p.name for p in run_dir.iterdir()
    }
    summary = json.loads((run_dir / "summary.json").read_text())
    audit = read_audit(run_dir, 2)
    assert len(audit[0]) == len(audit[1]) == summary["steps_per_rank"] > 0
    emitted = sorted(i for rank in audit for step in rank for i in step)
    # debug=smoke: 80 records, a seeded 16 held out for validation, the other 64 once each.
    assert emitted == sorted(epoch_permutation(80, 0, -1)[16:])
    assert summary["world_size"] == 2 and summary["emitted_samples"] == 64
    return run_dir


# Two ranks on two "nodes" of one process each. No hydra.run.dir: every process resolves
# conf/train.yaml's own, relative to its cwd.
TRAIN = [str(ROOT / "train.py"), "debug=smoke", "logger=csv", "audit_ids=true"]
TWO_NODES = ["trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"]


@pytest.mark.slow
def test_two_torchrun_nodes_write_one_run_dir(tmp_path: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    address = ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    commands = [[*torchrun, f"--node-rank={n}", *address, *TRAIN, *TWO_NODES] for n in (0, 1)]
    run_nodes(tmp_path, commands, [launcher_free_env()] * 2)
    run_dir = assert_one_run_dir(tmp_path)
    datetime.strptime(run_dir.name, "%Y-%m-%d_%H-%M-%S")  # rank 0's clock, as ${now:} was


@pytest.mark.slow
def test_two_srun_tasks_write_one_run_dir(tmp_path: Path) -> None:
    # What srun puts into each task's environment, as in examples/slurm_2nodes.sbatch.
    slurm = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NAME": "odb",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NNODES": "2",
        "SLURM_NODELIST": "localhost",
        "SLURM_LOCALID": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    envs = [launcher_free_env(**slurm, SLURM_PROCID=str(n), SLURM_NODEID=str(n)) for n in (0, 1)]
    run_nodes(tmp_path, [[sys.executable, *TRAIN, *TWO_NODES]] * 2, envs)
    assert assert_one_run_dir(tmp_path).name == "slurm-4242.0"


def run_externally(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """train.py as rank 0 of a 2-rank job some launcher started (no torchrun)."""
    ranks = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(free_port())}
    command = [
        sys.executable,
        "train.py",
        "debug=smoke",
        "trainer=ddp_cpu",
        "trainer.devices=1",
        "trainer.num_nodes=2",
        f"hydra.run.dir={tmp_path}",
    ]
    return subprocess.run(
        command,
        cwd=ROOT,
        env=launcher_free_env(**ranks, **env),
        capture_output=True,
        text=True,
        timeout=600,  # against a hang only: under load the imports alone take minutes
        check=False,
    )


@pytest.mark.slow  # tests/unit/app/test_run_dir names MASTER_ADDR's store in the default tier
def test_unresolvable_master_addr_fails_before_training(tmp_path: Path) -> None:
    done = run_externally(tmp_path, MASTER_ADDR=UNRESOLVABLE)
    assert done.returncode != 0
    # The launch check's own message, before the Trainer: not a timeout waited out (that
    # would end in the metadata channel's error after alignment_timeout_s).
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
