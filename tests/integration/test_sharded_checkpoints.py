"""An FSDP2 checkpoint directory: ``eval.py`` reads its shards in one process (the
run's own validation loss), and a resume under a strategy that reads single files is
refused naming the strategies that read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.train_run import ROOT, train


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("fsdp")
    summary = train(run_dir, "trainer=fsdp_cpu", timeout_s=300)
    return run_dir, summary


def _run(script: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, script, *overrides], cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def test_eval_reads_an_fsdp2_checkpoint_directory(
    sharded_run: tuple[Path, dict], tmp_path: Path
) -> None:
    """eval.py used to fail with a raw IsADirectoryError."""
    run_dir, summary = sharded_run
    checkpoint = (run_dir / "checkpoints" / "last.ckpt").resolve()
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2
    done = _run("eval.py", f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["samples"] == 16  # debug=smoke's held-out records
    # The same token-weighted loss the two ranks computed over the same records.
    assert result["loss"] == pytest.approx(summary["val_loss"], rel=1e-5)


def test_a_resume_with_a_single_file_strategy_names_the_fsdp2_trainers(
    sharded_run: tuple[Path, dict], tmp_path: Path
) -> None:
    """train.py used to fail with a bare IsADirectoryError: [Errno 21] Is a directory."""
    run_dir, _ = sharded_run
    last = run_dir / "checkpoints" / "last.ckpt"
    done = _run("train.py", f"ckpt_path={last}", "trainer=cpu", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 1
    assert (
        f"ckpt_path={last} is a sharded (FSDP2) checkpoint directory, which this trainer's "
        "strategy (SingleDeviceStrategy) cannot read: resume it with the FSDP2 strategy that "
        "wrote it, trainer=fsdp_cpu (CPU) or trainer=gpu8_fsdp (GPUs)"
    ) in done.stderr
    assert "IsADirectoryError" not in done.stderr and "Traceback" not in done.stderr
