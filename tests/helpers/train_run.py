"""Runs of the repository's ``train.py`` as a user runs it: a subprocess on the
seconds-long ``debug=smoke`` config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train(tmp_path: Path, *overrides: str, timeout_s: float = 600) -> dict:
    """Run train.py with ``overrides``; return its summary.json."""
    command = [sys.executable, "train.py", "debug=smoke", f"hydra.run.dir={tmp_path}", *overrides]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "odb_lightning run summary" in done.stdout
    return json.loads((tmp_path / "summary.json").read_text())


def read_audit(tmp_path: Path, world_size: int) -> list[list[list[int]]]:
    """Per rank, the dataset indices of every step (``audit_ids=true``)."""
    return [
        [json.loads(line)["indices"] for line in (tmp_path / f"emitted_ids_rank{r}.jsonl").open()]
        for r in range(world_size)
    ]


def read_audit_ids(tmp_path: Path, world_size: int) -> list[list[list[str | int]]]:
    """Per rank, the records' own ids of every step (``audit_ids=true``)."""
    return [
        [json.loads(line)["ids"] for line in (tmp_path / f"emitted_ids_rank{r}.jsonl").open()]
        for r in range(world_size)
    ]
