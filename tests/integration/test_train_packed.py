"""End-to-end ``odb_packed`` run of ``python train.py``: padding-free rows, every sample once.

A subprocess, as a user runs it, on the seconds-long ``debug=smoke`` config. The loss mixin
checks at every step that the supervised tokens of the packed labels equal the step
metadata's count, so a run that completes also shows that masking each packed sample's
first label dropped no target and added none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_packed_run_is_padding_free_and_emits_every_sample_once(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "train.py",
        "debug=smoke",
        "experiment=sharegpt_packed",
        "audit_ids=true",
        f"hydra.run.dir={tmp_path}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = [json.loads(line) for line in (tmp_path / "emitted_ids_rank0.jsonl").open()]
    # debug=smoke reads 80 records and holds 16 out for validation.
    assert sorted(i for step in steps for i in step) == list(range(64))
    assert summary["mode"] == "odb_packed"
    assert summary["emitted_samples"] == 64 == summary["train_samples"]
    assert summary["steps_per_rank"] == len(steps) == summary["optimizer_steps"]
    assert summary["padding_efficiency"] == 1.0
    assert summary["real_tokens"] == summary["padded_tokens"] > 0
    # Groups are formed under a real-token budget: on average they fill at most all of it.
    assert 0 < summary["budget_fill"] <= 1
    assert 0 < summary["loss_tokens"] < summary["real_tokens"]
    assert summary["train_loss"] > 0 and summary["val_loss"] > 0
