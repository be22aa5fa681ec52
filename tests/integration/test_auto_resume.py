"""``ckpt_path=auto``, as HF Trainer's ``resume_from_checkpoint=True``: the first attempt
starts anew and says so, the next one resumes from the run directory's newest valid
checkpoint; ``logger=tensorboard`` writes an event file on the way."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from helpers.train_run import ROOT


def _attempt(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "train.py", "debug=smoke", f"hydra.run.dir={run_dir}",
               "ckpt_path=auto", *overrides]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_auto_starts_anew_then_resumes_the_same_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _attempt(run_dir, "logger=tensorboard", "trainer.max_steps=3")
    assert (
        f"ckpt_path=auto: no valid checkpoint in {run_dir / 'checkpoints'}: starting a new run"
        in (first.stderr)
    )
    (events,) = run_dir.glob("tensorboard/version_0/events.out.tfevents.*")
    assert events.stat().st_size > 0
    before = json.loads((run_dir / "summary.json").read_text())
    assert before["optimizer_steps"] == 3

    # Lightning counts the epoch max_steps cut short as done: its rest is trainer epoch 1.
    second = _attempt(run_dir, "trainer.max_steps=-1", "trainer.max_epochs=2")
    resumed_from = run_dir / "checkpoints" / "last.ckpt"
    assert f"ckpt_path=auto: resuming from {resumed_from}" in second.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    # The counters continue: every training sample once over both attempts.
    assert summary["emitted_samples"] == summary["train_samples"] == 64
    assert summary["optimizer_steps"] > before["optimizer_steps"]
    assert re.fullmatch(r"epoch1-step\d+\.ckpt", resumed_from.resolve().name)  # pasteable
