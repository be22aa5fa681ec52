"""The GPU study's script runs its real code path on CPU (``--dry-run``).

Two arms through the application with the ``gpu8`` preset, DDP on gloo,
``bf16-mixed``: both must train on the same samples and real tokens, and the report
must be assembled without inventing GPU figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 24


@pytest.mark.slow
def test_dry_run_trains_every_arm_on_the_same_tokens(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "experiments.gpu.run", "--dry-run"]
    command += ["--arms", "standard,odb_packed"]
    command += ["--samples", str(SAMPLES), "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "dry_run.json").read_text())
    assert report["status"].startswith("dry run")
    standard, packed = report["arms"]["standard"], report["arms"]["odb_packed"]
    assert standard["emitted_samples"] == packed["emitted_samples"] == SAMPLES
    assert standard["real_tokens"] == packed["real_tokens"]
    assert standard["steps"] == SAMPLES // 8  # fixed batches of 8
    assert packed["padding_efficiency"] == 1.0 > standard["padding_efficiency"]
    assert packed["padded_tokens"] == packed["real_tokens"]
    # No CUDA: no peak GPU memory and no MFU (no known peak), rather than made-up ones.
    assert standard["peak_memory_gib"] is None and standard["mfu"] is None
    assert report["meta"]["peak_bf16_flops"] is None
    assert standard["model_tflops_per_s"] > 0
