"""A mixture of two sources through ``train.py``: each trains its share of an epoch
(weights 3:1), every record once across a 2-rank stop and resume, and the summary says
what each part trained."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers.train_run import ROOT, read_audit_ids


def _write(directory: Path) -> tuple[Path, Path]:
    turns = [{"role": "user", "content": "question?"}, {"role": "assistant", "content": "yes."}]
    a = directory / "a.jsonl"
    a.write_text("".join(json.dumps({"id": k, "messages": turns}) + "\n" for k in range(150)))
    conversation = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]
    b = directory / "b.json"  # a ShareGPT array, its layout detected as its own
    b.write_text(json.dumps([{"id": k, "conversations": conversation} for k in range(150)]))
    return a, b


def _mixture(a: Path, b: Path) -> str:
    return f"data.mixture=[{{path:'{a}',weight:3}},{{path:'{b}',weight:1}}]"


def _attempt(run_dir: Path, *overrides: str) -> tuple[dict, str]:
    command = [sys.executable, "train.py", "debug=smoke", f"hydra.run.dir={run_dir}",
               "audit_ids=true", "data.sizes.val_samples=0", *overrides]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads((run_dir / "summary.json").read_text()), done.stderr


def _check_shares(summary: dict, ids: list[str]) -> None:
    # debug=smoke caps the mixture at 80 records: 60 of a.jsonl and 20 of b.json.
    assert summary["mixture"]["a.jsonl"]["records"] == 60
    assert summary["mixture"]["b.json"]["records"] == 20
    assert len(ids) == len(set(ids)) == 80  # every record of the mixture once
    parts = Counter(i.split(":")[0] for i in ids)
    assert parts == {"a.jsonl": 60, "b.json": 20}
    trained = summary["mixture_trained"]
    assert trained["a.jsonl"]["samples"] == 60 and trained["b.json"]["samples"] == 20
    assert abs(trained["a.jsonl"]["share"] - 0.75) < 0.01
    assert trained["a.jsonl"]["tokens"] > 0 and trained["b.json"]["tokens"] > 0


def test_a_mixture_trains_each_part_in_its_share(tmp_path: Path) -> None:
    a, b = _write(tmp_path)
    run = tmp_path / "run"
    summary, _ = _attempt(run, _mixture(a, b))
    assert summary["source"] == "mixture"
    (steps,) = read_audit_ids(run, 1)
    _check_shares(summary, [i for step in steps for i in step])


@pytest.mark.slow
def test_a_mixture_resumes_every_record_once_at_two_ranks(tmp_path: Path) -> None:
    a, b = _write(tmp_path)
    run = tmp_path / "run"
    # A small budget, so that the epoch takes several steps to stop in the middle of.
    small = ["batching.token_budget=256", "data.sizes.max_seq_len=256"]
    common = [_mixture(a, b), "trainer=ddp_cpu", "ckpt_path=auto", *small]
    first, _ = _attempt(run, *common, "trainer.max_steps=2")
    assert first["optimizer_steps"] == 2 and 0 < first["emitted_samples"] < 80
    # Lightning counts the epoch max_steps cut short as done: its rest is trainer epoch 1.
    summary, log = _attempt(run, *common, "trainer.max_steps=-1", "trainer.max_epochs=2")
    assert "ckpt_path=auto: resuming from" in log  # the rest of the epoch, not a new run
    ids = [i for rank in read_audit_ids(run, 2) for step in rank for i in step]
    _check_shares(summary, ids)
