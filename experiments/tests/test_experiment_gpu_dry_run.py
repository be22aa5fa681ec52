"""The GPU study's script runs its real code path on CPU (``--dry-run``).

Three arms through the application, DDP (``gpu8``) and FSDP2 (``gpu8_fsdp``) presets on
gloo, ``bf16-mixed``: the 0.5B-shaped arms must train on the same samples and real tokens,
and the report must be assembled from the run summaries' step metrics without inventing
GPU figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 24


@pytest.mark.slow  # three train.py runs in processes of their own: about a minute
def test_dry_run_trains_every_arm_on_the_same_tokens(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "experiments.gpu.run", "--dry-run"]
    command += ["--arms", "standard,odb_packed,fsdp2_1_5b", "--fsdp-steps", "2"]
    command += ["--samples", str(SAMPLES), "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "dry_run.json").read_text())
    assert report["status"].startswith("dry run")
    arms = report["arms"]
    standard, packed, fsdp = arms["standard"], arms["odb_packed"], arms["fsdp2_1_5b"]
    assert standard["emitted_samples"] == packed["emitted_samples"] == SAMPLES
    assert standard["real_tokens"] == packed["real_tokens"]
    assert standard["steps"] == SAMPLES // 8  # fixed batches of 8
    assert packed["padding_efficiency"] == 1.0 > standard["padding_efficiency"]
    assert packed["padded_tokens"] == packed["real_tokens"]
    assert fsdp["steps"] == 2 and fsdp["vs_standard"] is None  # another model
    assert packed["vs_standard"] == packed["real_tokens_per_s"] / standard["real_tokens_per_s"]
    for row in arms.values():
        # No CUDA: no peak GPU memory and no MFU (no known peak), rather than made-up ones.
        assert row["peak_memory_gib"] is None and row["mfu"] is None
        assert row["model_tflops_per_s"] > 0 and row["step_time_mean_s"] > 0
    assert report["meta"]["peak_bf16_flops"] is None
