"""Exact mid-epoch resume through Lightning checkpoints, as a user runs it:
``train.py trainer.max_steps=K callbacks.checkpoint.every_n_train_steps=K`` stops
mid-epoch, ``train.py ckpt_path=<dir>/checkpoints/last.ckpt trainer.max_steps=-1
callbacks.checkpoint.every_n_train_steps=null`` finishes the run (the resume runs with the
checkpoint's config, whose ``max_steps`` and checkpoint cadence made the stop: the
resume's command line lifts them).

The samples emitted before the checkpoint plus those emitted after it are the epoch, each
exactly once, and the step counters, the optimizer and the LR schedule go on where they
stopped.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.train_run import ROOT, read_audit, train
from odb_lightning.core.order import epoch_permutation

TRAIN_INDICES = sorted(epoch_permutation(80, 0, -1)[16:])  # debug=smoke: 64 train records
STOP_AT = 3
# What made the first run a stop, in the config the resume takes from the checkpoint.
LIFT_THE_STOP = ("trainer.max_steps=-1", "callbacks.checkpoint.every_n_train_steps=null")


def _mode_overrides(mode: str, tmp_path: Path) -> list[str]:
    return [f"experiment=sharegpt_{mode}", f"data.caches.length_dir={tmp_path / 'cache'}"]


def stop_and_resume(
    tmp_path: Path, *overrides: str, resume_overrides: tuple[str, ...] = ()
) -> tuple[dict, dict, Path, Path]:
    """Run to ``STOP_AT`` optimizer steps with a checkpoint there, then resume from it."""
    first, second = tmp_path / "first", tmp_path / "second"
    stopped = train(
        first,
        *overrides,
        "audit_ids=true",
        f"trainer.max_steps={STOP_AT}",
        f"callbacks.checkpoint.every_n_train_steps={STOP_AT}",
    )
    resumed = train(
        second,
        *overrides,
        *resume_overrides,
        "audit_ids=true",
        *LIFT_THE_STOP,
        f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}",
    )
    return stopped, resumed, first, second


def _emitted(run_dir: Path, world_size: int) -> Counter[int]:
    return Counter(i for rank in read_audit(run_dir, world_size) for step in rank for i in step)


# Slow: the default tier resumes the same odb run through train.py on 2 ranks (below,
# with the same counters) and in one process through Lightning (test_resume_lightning.py).
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["odb", "standard", "bucketed"])
def test_single_process_resume_emits_the_epoch_exactly_once(mode: str, tmp_path: Path) -> None:
    stopped, resumed, first, second = stop_and_resume(tmp_path, *_mode_overrides(mode, tmp_path))
    before, after = _emitted(first, 1), _emitted(second, 1)
    assert stopped["optimizer_steps"] == STOP_AT and 0 < sum(before.values()) < 64
    assert before + after == Counter(TRAIN_INDICES), "every sample once: none lost or repeated"
    # Counters go on: the resumed summary covers the whole run.
    (steps_after,) = read_audit(second, 1)
    assert resumed["optimizer_steps"] == STOP_AT + len(steps_after)
    assert resumed["steps_per_rank"] == STOP_AT + len(steps_after)
    assert resumed["emitted_samples"] == 64
    assert resumed["wall_s"] > stopped["wall_s"]


def _final_weights(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict, dict]:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    return checkpoint["state_dict"], checkpoint["lr_schedulers"][0], checkpoint


@pytest.mark.slow  # the in-process check: tests/integration/test_resume_lightning.py
def test_resumed_standard_run_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """Same batches, same optimizer and LR state: the same model as without the stop."""
    overrides = (
        "experiment=sharegpt_standard",
        "model.scheduler.decay_steps=12",
        "model.scheduler.warmup_steps=2",
    )
    whole = tmp_path / "whole"
    train(whole, *overrides, "audit_ids=true")
    _, _, first, second = stop_and_resume(tmp_path, *overrides)
    (steps_before,), (steps_after,) = read_audit(first, 1), read_audit(second, 1)
    (steps_whole,) = read_audit(whole, 1)
    assert steps_before + steps_after == steps_whole, "the run goes on with the next batch"
    weights, schedule, resumed = _final_weights(second)
    weights_whole, schedule_whole, uninterrupted = _final_weights(whole)
    assert schedule["last_epoch"] == schedule_whole["last_epoch"] == len(steps_whole)
    assert resumed["global_step"] == uninterrupted["global_step"]
    for name, tensor in weights_whole.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "mode",
    # Slow: exact resume of the ODB window and queue is proven in-process in
    # tests/unit/runtime/test_runtime_resume.py and under Lightning's loop in
    # test_resume_lightning.
    [
        pytest.param("odb", marks=pytest.mark.slow),
        pytest.param("standard", marks=pytest.mark.slow),
        pytest.param("bucketed", marks=pytest.mark.slow),
        # The epoch is less than a window per rank: the resumed run groups the rest of
        # it across ranks, which moves samples between the ranks.
        "odb_cross_rank",
    ],
)
def test_ddp_resume_emits_the_epoch_exactly_once(mode: str, tmp_path: Path) -> None:
    overrides = (*_mode_overrides(mode.removesuffix("_cross_rank"), tmp_path), "trainer=ddp_cpu")
    if mode.endswith("_cross_rank"):
        # Fetch-aware dealing off: the deal, and so what the pooled round moves, is then
        # the data's alone. With it on the deal follows the fetch times, and so does the
        # count of moved samples (10-14 in runs beside CPU hogs, and none in one CI
        # run). Its resume is exact too: tests/unit/runtime/test_runtime_resume.py.
        overrides = (
            *overrides,
            "batching.policy.cross_rank_grouping=true",
            "batching.policy.fetch_aware_dealing=false",
        )
    stopped, resumed, first, second = stop_and_resume(tmp_path, *overrides)
    before, after = _emitted(first, 2), _emitted(second, 2)
    assert 0 < sum(before.values()) < 64
    # The sample-budget LR schedule's position: global samples seen, restored on resume.
    checkpoint = torch.load(first / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["odb_samples_seen"] == sum(before.values())
    assert before + after == Counter(TRAIN_INDICES), "every sample once: none lost or repeated"
    audit = read_audit(second, 2)
    assert len(audit[0]) == len(audit[1]), "equal step counts after the resume"
    # Counters go on: the resumed summary covers the whole run.
    assert stopped["optimizer_steps"] == STOP_AT
    assert resumed["optimizer_steps"] == resumed["steps_per_rank"] == STOP_AT + len(audit[0])
    assert resumed["emitted_samples"] == 64
    assert resumed["wall_s"] > stopped["wall_s"]
    if mode.endswith("_cross_rank"):
        # The summary counts finished epochs: the resumed run's pooled round moved samples.
        assert resumed["moved_samples"] > 0 and resumed["moved_bytes"] > 0
        rank_steps = 2 * resumed["steps_per_rank"]
        assert resumed["moved_bytes_per_rank_step"] == resumed["moved_bytes"] / rank_steps
        assert resumed["moved_samples_per_rank_step"] == resumed["moved_samples"] / rank_steps


@pytest.mark.slow
def test_checkpoint_of_two_ranks_resumes_on_one(tmp_path: Path) -> None:
    """The rest of the epoch is re-sharded over the ranks there are now."""
    overrides = _mode_overrides("odb", tmp_path)
    _, _, first, second = stop_and_resume(
        tmp_path, *overrides, "trainer=ddp_cpu", resume_overrides=("trainer=cpu",)
    )
    assert _emitted(first, 2) + _emitted(second, 1) == Counter(TRAIN_INDICES)


@pytest.mark.slow  # the data handshake's rule: tests/unit/core/test_config.py
def test_checkpoint_of_other_data_is_refused(tmp_path: Path) -> None:
    first = tmp_path / "first"
    train(
        first, f"trainer.max_steps={STOP_AT}", f"callbacks.checkpoint.every_n_train_steps={STOP_AT}"
    )
    command = [
        sys.executable,
        "train.py",
        "debug=smoke",
        "data.sizes.max_samples=72",
        f"hydra.run.dir={tmp_path / 'second'}",
        f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "the checkpoint was taken on other training data" in done.stderr
    assert "max_samples: 80 -> 72" in done.stderr


@pytest.mark.slow  # the in-process check: test_resume_lightning.py, epoch_end_* scenarios
def test_checkpoint_at_epoch_end_resumes_with_the_next_epoch_in_full(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    train(first, "audit_ids=true")  # last.ckpt is written at the end of the epoch
    resumed = train(
        second,
        "audit_ids=true",
        "trainer.max_epochs=2",
        f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}",
    )
    assert _emitted(second, 1) == Counter(TRAIN_INDICES), "epoch 1 runs in full"
    assert resumed["emitted_samples"] == 128


def _sharded_weights(checkpoint_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    """The full weights of an FSDP2 checkpoint directory (one shard file per rank)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint_dir, out)
    return torch.load(out, weights_only=True)["state_dict"]


@pytest.mark.slow
def test_fsdp2_resume_emits_the_epoch_exactly_once(tmp_path: Path) -> None:
    """FSDP2 checkpoints are directories of shards; the data module's state rides along."""
    overrides = (*_mode_overrides("odb", tmp_path), "trainer=fsdp_cpu")
    stopped, resumed, first, second = stop_and_resume(tmp_path, *overrides)
    checkpoint = (first / "checkpoints" / "last.ckpt").resolve()
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2
    before, after = _emitted(first, 2), _emitted(second, 2)
    assert stopped["optimizer_steps"] == STOP_AT and 0 < sum(before.values()) < 64
    assert before + after == Counter(TRAIN_INDICES), "every sample once: none lost or repeated"
    audit = read_audit(second, 2)
    assert len(audit[0]) == len(audit[1]), "equal step counts after the resume"
    assert resumed["steps_per_rank"] == STOP_AT + len(audit[0])
    assert resumed["emitted_samples"] == 64


@pytest.mark.slow  # FSDP2 resume: test_fsdp2_resume_emits_the_epoch_exactly_once stays default
def test_fsdp2_resumed_standard_run_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """Sharded weights and optimizer state restored: the same model as without the stop.
    ``decay_steps`` is pinned because the stopped run's ``max_steps`` would otherwise be
    its cosine's length (the resume test above runs the trainer-derived length under
    FSDP2, which may ask for it only once the restored checkpoint reached the loader)."""
    overrides = (
        "experiment=sharegpt_standard",
        "trainer=fsdp_cpu",
        "model.scheduler.decay_steps=12",
        "model.scheduler.warmup_steps=2",
    )
    whole = tmp_path / "whole"
    train(whole, *overrides, "audit_ids=true")
    _, _, first, second = stop_and_resume(tmp_path, *overrides)
    before, after, uninterrupted = (read_audit(d, 2) for d in (first, second, whole))
    for rank in range(2):
        assert before[rank] + after[rank] == uninterrupted[rank], "the run goes on"
    resumed = _sharded_weights((second / "checkpoints" / "last.ckpt").resolve(), tmp_path / "r")
    expected = _sharded_weights((whole / "checkpoints" / "last.ckpt").resolve(), tmp_path / "w")
    stopped = _sharded_weights((first / "checkpoints" / "last.ckpt").resolve(), tmp_path / "s")
    assert resumed.keys() == expected.keys() and expected
    moved = 0
    for name, tensor in expected.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(stopped[name], tensor)
    assert moved > 0, "the steps after the stop changed the weights"


def _job_log(run_dir: Path) -> str:
    """The Hydra job log of rank 0 (the warnings of the run)."""
    return "\n".join(p.read_text() for p in sorted(run_dir.glob("*.log")))


@pytest.mark.slow  # the fallback's rule: tests/unit/lit/test_checkpoints.py
def test_dangling_last_ckpt_resumes_from_the_newest_valid_checkpoint(tmp_path: Path) -> None:
    """A kill between deleting the old checkpoint and re-linking last.ckpt left it naming a
    deleted file: the resume takes the newest valid checkpoint beside it, and says so."""
    first, second = tmp_path / "first", tmp_path / "second"
    train(
        first,
        "audit_ids=true",
        f"trainer.max_steps={STOP_AT}",
        f"callbacks.checkpoint.every_n_train_steps={STOP_AT}",
    )
    checkpoints = first / "checkpoints"
    (valid,) = [p for p in checkpoints.iterdir() if not p.is_symlink()]
    last = checkpoints / "last.ckpt"
    last.unlink()
    last.symlink_to("epoch=0-step=2.ckpt")  # the deleted predecessor
    assert not last.exists()
    resumed = train(second, "audit_ids=true", *LIFT_THE_STOP, f"ckpt_path={last}")
    assert _emitted(first, 1) + _emitted(second, 1) == Counter(TRAIN_INDICES)
    assert resumed["optimizer_steps"] == STOP_AT + len(read_audit(second, 1)[0])
    log = _job_log(second)
    assert f"resuming from {valid} instead of {last}" in log
    assert "it links to epoch=0-step=2.ckpt, which does not exist" in log


@pytest.mark.slow
def test_resume_with_another_budget_and_window_warns_and_is_recorded(tmp_path: Path) -> None:
    overrides = _mode_overrides("odb", tmp_path)
    _, resumed, _, second = stop_and_resume(
        tmp_path,
        *overrides,
        resume_overrides=("batching.token_budget=8192", "batching.policy.outstanding_depth=64"),
    )
    assert resumed["emitted_samples"] == 64, "warned, not refused"
    # sharegpt_odb's budget; debug=smoke's window.
    assert resumed["resume_changed_settings"] == {
        "token_budget": {"old": 4096, "new": 8192},
        "outstanding_depth": {"old": 32, "new": 64},
    }
    assert "token_budget: 4096 -> 8192, outstanding_depth: 32 -> 64" in _job_log(second)
