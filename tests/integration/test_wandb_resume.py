"""A resumed job logs into the W&B run it continues: the two attempts' offline runs carry
the one id, which ``wandb sync`` uploads as one run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.train_run import ROOT


def _attempt(run_dir: Path, *overrides: str) -> None:
    command = [sys.executable, "train.py", "debug=smoke", f"hydra.run.dir={run_dir}",
               "ckpt_path=auto", "logger=wandb", *overrides]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
def test_a_resume_continues_the_first_jobs_wandb_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _attempt(run_dir, "trainer.max_steps=3")
    _attempt(run_dir, "trainer.max_steps=6")
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, runs
    ids = {path.name.rsplit("-", 1)[1] for path in runs}
    assert ids == {(run_dir / "wandb_run_id").read_text().strip()}
