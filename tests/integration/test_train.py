"""End-to-end runs of `python train.py`: single process, 2-rank DDP and 2-rank FSDP2 on CPU.

Each run is a subprocess, as a user runs it, on a seconds-long config (``debug=smoke``:
a one-layer body and token ids folded to 4,096 so that the LM head stays small).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.train_run import read_audit, train
from odb_lightning.core.order import epoch_permutation, shard_indices


@pytest.mark.parametrize("experiment", ["sharegpt_odb", "sharegpt_standard"])
def test_single_process_run_writes_an_exact_summary(experiment: str, tmp_path: Path) -> None:
    summary = train(tmp_path, f"experiment={experiment}", "audit_ids=true")
    (steps,) = read_audit(tmp_path, 1)
    emitted = [i for step in steps for i in step]
    # debug=smoke reads 80 records and holds out a seeded 16 for validation; the audit
    # names dataset indices, so it must list exactly the other 64, once each.
    train_indices = sorted(epoch_permutation(80, 0, -1)[16:])
    assert sorted(emitted) == train_indices
    assert summary["emitted_samples"] == 64 == summary["train_samples"]
    assert summary["steps_per_rank"] == len(steps) == summary["optimizer_steps"]
    assert 0 < summary["padding_efficiency"] <= 1
    assert summary["real_tokens"] <= summary["padded_tokens"]
    assert summary["mode"] == experiment.removeprefix("sharegpt_")
    assert summary["val_loss"] > 0 and summary["train_loss"] > 0
    if experiment == "sharegpt_standard":
        assert all(len(step) == 8 for step in steps)


def write_skewed_jsonl(path: Path, num_records: int, seed: int) -> None:
    """Rank 0's shard (under the default seeded sharding) holds long conversations,
    rank 1's short ones, so rank 1 runs out first and must take IDLE steps."""
    long_rank = set(shard_indices(num_records, 2, 0, seed, 0))
    with path.open("w", encoding="utf-8") as out:
        for index in range(num_records):
            words = 220 if index in long_rank else 6
            answer = " ".join(f"word{(index * 7 + k) % 97}" for k in range(words))
            record = {
                "id": f"r{index}",
                "messages": [
                    {"role": "user", "content": f"question number {index}?"},
                    {"role": "assistant", "content": answer},
                ],
            }
            out.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("trainer", ["ddp_cpu", "fsdp_cpu"])
def test_two_ranks_skewed_shards_every_sample_once(trainer: str, tmp_path: Path) -> None:
    # fsdp_cpu: the same data path under FSDP2 (sharded module, IDLE steps through it).
    data = tmp_path / "skewed.jsonl"
    write_skewed_jsonl(data, 48, seed=0)
    run_dir = tmp_path / "run"
    summary = train(
        run_dir,
        f"trainer={trainer}",
        "audit_ids=true",
        "data=jsonl",
        f"data.path={data}",
        "data.max_samples=null",
        "data.val_samples=0",
        "batching.max_steps_per_round=1",
        "batching.outstanding_depth=64",
    )
    audit = read_audit(run_dir, 2)
    assert len(audit[0]) == len(audit[1]) == summary["steps_per_rank"]
    emitted = [i for rank in audit for step in rank for i in step]
    assert sorted(emitted) == list(range(48))  # every sample exactly once
    idle = sum(1 for rank in audit for step in rank if not step)
    assert idle > 0 and summary["idle_steps"] == idle
    assert summary["emitted_samples"] == 48 and summary["world_size"] == 2
    assert summary["train_loss"] is not None and summary["train_loss"] > 0
    assert [r["steps"] for r in summary["per_rank"]] == [summary["steps_per_rank"]] * 2
    (checkpoint,) = (run_dir / "checkpoints").glob("epoch=*.ckpt")
    if trainer == "fsdp_cpu":  # sharded for real: each rank saved its own shard
        shards = sorted(p.name for p in checkpoint.glob("*.distcp"))
        assert checkpoint.is_dir() and shards == ["__0_0.distcp", "__1_0.distcp"]
    else:
        assert checkpoint.is_file()


def test_fsdp2_validation_with_an_idle_batch_runs_every_forward(tmp_path: Path) -> None:
    """24 validation samples in batches of 8 over 2 ranks: rank 1's second batch is IDLE.
    Its forward still runs (the all-gathers of the sharded forward are collectives), and
    its loss is not counted."""
    summary = train(tmp_path, "trainer=fsdp_cpu", "data.val_samples=24", timeout_s=240)
    assert summary["world_size"] == 2 and summary["val_loss"] > 0
