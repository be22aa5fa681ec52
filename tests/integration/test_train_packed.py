"""End-to-end ``odb_packed`` run of ``python train.py``: padding-free rows, every sample once.

A subprocess, as a user runs it, on the seconds-long ``debug=smoke`` config. The loss mixin
checks at every step that the supervised tokens of the packed labels equal the step
metadata's count, so a run that completes also shows that masking each packed sample's
first label dropped no target and added none.
"""

from __future__ import annotations

from pathlib import Path

from helpers.train_run import read_audit, train
from odb_lightning.core.order import epoch_permutation


def test_packed_run_is_padding_free_and_emits_every_sample_once(tmp_path: Path) -> None:
    summary = train(tmp_path, "experiment=sharegpt_packed", "audit_ids=true")
    (steps,) = read_audit(tmp_path, 1)
    # debug=smoke reads 80 records and holds out a seeded 16 for validation.
    train_indices = sorted(epoch_permutation(80, 0, -1)[16:])
    assert sorted(i for step in steps for i in step) == train_indices
    assert summary["mode"] == "odb_packed"
    assert summary["emitted_samples"] == 64 == summary["train_samples"]
    assert summary["steps_per_rank"] == len(steps) == summary["optimizer_steps"]
    assert summary["padding_efficiency"] == 1.0
    assert summary["real_tokens"] == summary["padded_tokens"] > 0
    # Groups are formed under a real-token budget: on average they fill at most all of it.
    assert 0 < summary["budget_fill"] <= 1
    assert 0 < summary["loss_tokens"] < summary["real_tokens"]
    assert summary["train_loss"] > 0 and summary["val_loss"] > 0
