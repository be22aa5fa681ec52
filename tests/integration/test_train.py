"""End-to-end runs of `python train.py`: single process, 2-rank DDP and 2-rank FSDP2 on CPU.

Each run is a subprocess, as a user runs it, on a seconds-long config (``debug=smoke``:
a one-layer body and token ids folded to 4,096 so that the LM head stays small).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.train_run import ROOT, read_audit, train
from odb_lightning.core.order import epoch_permutation, shard_indices
from odb_lightning.lit.callbacks.id_audit import IdAudit


@pytest.mark.parametrize(
    "experiment", ["sharegpt_odb", pytest.param("sharegpt_standard", marks=pytest.mark.slow)]
)
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
    # Step metrics: model FLOPs and per-device rates; a CPU has no known peak, so no MFU.
    assert summary["model_flops"] > 0 and summary["tokens_per_s_per_device"] > 0
    assert summary["step_time_s_per_rank"] == [summary["step_time_max_s"]]
    assert summary["mfu"] is None and summary["peak_tflops_per_device"] is None
    # One ODB group a step holds neighbouring lengths of the sorted window; fixed batches
    # of a shuffled epoch mix them (lit/callbacks/length_mix.py).
    if experiment == "sharegpt_odb":
        assert 0 < summary["step_length_cv"] < 0.3
    if experiment == "sharegpt_standard":
        assert summary["step_length_cv"] > 0.3
        assert all(len(step) == 8 for step in steps)
        assert summary["over_budget_samples"] is None  # batch_size samples: no budget


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


@pytest.mark.parametrize(
    "trainer",
    # Slow: every sample once with equal steps over skewed shards is proven on real
    # processes in test_runtime_alignment (fork/join, four skewed ranks); the default
    # tier's 2-rank train.py runs are the SIGTERM test and test_sharded_checkpoints.
    [pytest.param(t, marks=pytest.mark.slow) for t in ("ddp_cpu", "fsdp_cpu")],
)
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
        f"data.source.path={data}",
        "data.sizes.max_samples=null",
        "data.sizes.val_samples=0",
        "batching.policy.max_steps_per_round=1",
        "batching.policy.outstanding_depth=64",
        "batching.policy.shard_dealing=fixed",  # the skew stays on one rank: IDLE steps
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
    # Step metrics over both ranks: each rank's mean step time, their max and mean.
    step_s = summary["step_time_s_per_rank"]
    assert len(step_s) == 2 and summary["step_time_max_s"] == max(step_s)
    assert summary["step_time_mean_s"] == pytest.approx(sum(step_s) / 2)
    (checkpoint,) = (run_dir / "checkpoints").glob("epoch*-step*.ckpt")
    if trainer == "fsdp_cpu":  # sharded for real: each rank saved its own shard
        shards = sorted(p.name for p in checkpoint.glob("*.distcp"))
        assert checkpoint.is_dir() and shards == ["__0_0.distcp", "__1_0.distcp"]
    else:
        assert checkpoint.is_file()


@pytest.mark.slow  # FSDP2's default-tier runs: test_sharded_checkpoints, test_exact_loss_sharded
def test_fsdp2_validation_with_an_idle_batch_runs_every_forward(tmp_path: Path) -> None:
    """24 validation samples in batches of 8 over 2 ranks: rank 1's second batch is IDLE.
    Its forward still runs (the all-gathers of the sharded forward are collectives), and
    its loss is not counted."""
    summary = train(tmp_path, "trainer=fsdp_cpu", "data.sizes.val_samples=24")
    assert summary["world_size"] == 2 and summary["val_loss"] > 0


def _write_records(path: Path, records: list[list[tuple[str, str]]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for index, turns in enumerate(records):
            messages = [{"role": role, "content": content} for role, content in turns]
            out.write(json.dumps({"id": f"r{index}", "messages": messages}) + "\n")


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "train.py", "debug=smoke", f"hydra.run.dir={tmp_path}"]
    return subprocess.run(
        [*command, *overrides], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_user_only_records_are_refused_at_startup(tmp_path: Path) -> None:
    data = tmp_path / "user_only.jsonl"
    turns = [("system", "be brief"), ("user", "hello")]
    _write_records(data, [[("user", f"question {i}?")] for i in range(39)] + [turns])
    done = _run(tmp_path / "run", "data=jsonl", f"data.source.path={data}")
    assert done.returncode != 0
    assert (
        f"data.source.name='jsonl' data.source.path='{data}': no supervised tokens to train on: "
        # debug=smoke holds out 0.2
        "read 40 records, 32 for training, and none has an assistant turn"
    ) in done.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


LONG = " ".join(f"word{k}" for k in range(300))  # far more than max_seq_len=64 tokens


# Slow: test_own_data's run counts truncation and bad lines in the default tier.
@pytest.mark.parametrize(
    "batching", [pytest.param(b, marks=pytest.mark.slow) for b in ("odb", "sorted")]
)
def test_summary_counts_unsupervised_and_truncated_records(batching: str, tmp_path: Path) -> None:
    records = [[("user", f"question {i}?"), ("assistant", f"answer {i}")] for i in range(20)]
    records += [[("user", f"no answer {i}")] for i in range(5)]  # unsupervised
    records += [[("system", "a system prompt only")]]  # unsupervised
    records += [[("user", "tell me"), ("assistant", LONG)] for _ in range(3)]  # cut (tail)
    data = tmp_path / "mix.jsonl"
    _write_records(data, records)
    common = [
        "data=jsonl",
        f"data.source.path={data}",
        "data.sizes.max_samples=null",
        "data.sizes.val_samples=0",
    ]
    summary = train(
        tmp_path / "run",
        *common,
        "data.sizes.max_seq_len=64",
        "data.sizes.truncation=tail",  # the default would drop a one-exchange chat
        f"batching={batching}",
        f"data.caches.length_dir={tmp_path / 'cache'}",
    )
    assert summary["train_samples"] == 29 == summary["emitted_samples"]
    assert summary["unsupervised_samples"] == 6
    # sorted: from the length pass; odb: from the loader's epoch statistics.
    assert summary["truncated_samples"] == 3
    assert summary["train_loss"] > 0


@pytest.mark.slow
def test_limit_train_batches_reports_the_samples_not_trained(tmp_path: Path) -> None:
    done = _run(tmp_path, "+trainer.limit_train_batches=2", "batching=standard")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["optimizer_steps"] == 2 and summary["emitted_samples"] == 16
    assert summary["not_trained_samples"] == 64 - 16
    assert "not-trained samples" in done.stdout


def test_audit_file_is_flushed_after_every_step(tmp_path: Path) -> None:
    """A run killed mid-epoch (SIGKILL: nothing is closed) keeps one line per step."""
    callback = IdAudit(str(tmp_path), enabled=True)
    trainer = SimpleNamespace(global_rank=0)
    callback.on_train_start(trainer, None)  # type: ignore[arg-type]
    for step in range(3):
        meta = SimpleNamespace(
            is_idle=False,
            local_samples=2,
            local_real_tokens=10,
            local_padded_tokens=12,
            local_loss_tokens=4,
            sample_ids=(2 * step, 2 * step + 1),
        )
        batch = SimpleNamespace(meta=meta)
        callback.on_train_batch_end(trainer, None, None, batch, step)  # type: ignore[arg-type]
        lines = (tmp_path / "emitted_ids_rank0.jsonl").read_text().splitlines()
        expected = [2 * step, 2 * step + 1]  # no record ids given: the ids are the indices
        assert json.loads(lines[-1]) == {"ids": expected, "indices": expected}
        assert len(lines) == step + 1


@pytest.mark.slow
def test_assistant_turns_cut_off_are_refused_after_the_first_epoch(tmp_path: Path) -> None:
    """Online modes cannot see truncation at startup: every assistant turn lies beyond
    max_seq_len, so the run stops after the first epoch instead of finishing silently."""
    data = tmp_path / "cut.jsonl"
    _write_records(data, [[("user", LONG), ("assistant", f"answer {i}")] for i in range(24)])
    overrides = [
        "data=jsonl",
        f"data.source.path={data}",
        "data.sizes.max_seq_len=64",
        "data.sizes.val_samples=0",
    ]
    done = _run(tmp_path / "run", *overrides)
    assert done.returncode != 0
    assert (
        "no supervised tokens in the first training epoch: 24 samples emitted over 1 rank(s), "
        "every label -100 after the template and max_seq_len=64"
    ) in done.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
