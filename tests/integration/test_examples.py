"""The examples run as a user runs them, and keep the loader's guarantees: every record
emitted once per epoch over the ranks, the same number of steps on every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.torchrun import ROOT, launcher_free_env, run_script_on_ranks

NUM_TOY_RECORDS = 48  # what both examples train on without --jsonl


def _emitted(steps: list[dict]) -> list[int]:
    return [i for step in steps if not step["idle"] for i in step["ids"]]


def _run_example(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=launcher_free_env(), capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.mark.slow
def test_plain_loop_in_one_process(tmp_path: Path) -> None:
    done = _run_example("examples/plain_loop.py", "--out", str(tmp_path))
    record = json.loads((tmp_path / "steps_rank0.json").read_text())
    assert record["world_size"] == 1
    assert sorted(_emitted(record["steps"])) == list(range(NUM_TOY_RECORDS))  # once each
    assert len(record["steps"]) > 1 and "epoch 0 step 0:" in done.stdout


@pytest.mark.slow
def test_plain_loop_under_torchrun_with_ddp(tmp_path: Path) -> None:
    run_script_on_ranks("examples/plain_loop.py", "--out", str(tmp_path))
    ranks = [json.loads((tmp_path / f"steps_rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert len(ranks[0]["steps"]) == len(ranks[1]["steps"])  # DDP's all-reduces pair up
    emitted = _emitted(ranks[0]["steps"]) + _emitted(ranks[1]["steps"])
    assert sorted(emitted) == list(range(NUM_TOY_RECORDS))  # each record on one rank, once


@pytest.mark.parametrize(
    "devices", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_lightning_module_example(devices: int, tmp_path: Path) -> None:
    out = tmp_path / "metrics.json"
    _run_example("examples/lightning_module.py", "--devices", str(devices), "--out", str(out))
    metrics = json.loads(out.read_text())
    assert metrics["global_step"] >= 1
    # An untrained model over Qwen's 151,936 ids starts near ln(151936) = 11.93.
    assert 0 < metrics["train/loss"] < 13 and 0 < metrics["val/loss"] < 13
