"""Running a test file as a script under torchrun (2 gloo ranks on this machine), in an
environment free of any launcher the tests themselves may run under."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "GLOO_SOCKET", "NCCL_SOCKET")
LAUNCHER_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This environment without the variables of a launcher, with the checkout's root
    (``testing``) and ``tests/`` (the helpers) on ``PYTHONPATH`` and ``extra`` on top."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)
    }
    paths = [str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return {**env, **extra}


def run_script_on_ranks(script: str, *args: str, ranks: int = 2, timeout_s: float = 600) -> None:
    """``torchrun --standalone --nproc_per_node=<ranks> <script> <args>``; fails the test
    with the output's tail when it does not exit 0."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*torchrun, f"--nproc_per_node={ranks}", str(Path(script).resolve()), *args],
        cwd=ROOT,
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def leave_ranks() -> None:
    """End a script's ranks in order: every rank meets, then the process group (and its
    Gloo threads) is destroyed before the interpreter exits. Left to interpreter exit,
    a rank can abort in teardown ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
