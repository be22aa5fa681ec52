"""Failures end every rank with an error that names what failed, within bounded time,
and leave no child process behind."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_runtime_harness import (
    RankJob,
    SyntheticChatDataset,
    run_ranks,
    run_silent_peer,
    wait_gone,
)

from odb_lightning.core.alignment import PeerFailedError
from odb_lightning.runtime import (
    BadSampleError,
    LoaderProcessError,
    MetadataChannelError,
    ODBLoader,
    SampleFetchError,
)

LOADER = {
    "token_budget": 600,
    "outstanding_depth": 32,
    "max_steps_per_round": 4,
    "multiprocessing_context": "fork",
}


def _loader(dataset: SyntheticChatDataset, **overrides: object) -> ODBLoader:
    return ODBLoader(dataset, **{**LOADER, "num_workers": 2, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize("victim", ["worker 1", "collate process"])
def test_killed_child_raises_naming_it(victim: str) -> None:
    loader = _loader(SyntheticChatDataset.seeded(3000))
    with loader:
        batches = iter(loader)
        next(batches)
        pids = loader.child_pids()
        os.kill(pids[victim], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(LoaderProcessError, match=rf"{victim} \(pid {pids[victim]}\).*SIGKILL"):
            for _ in batches:
                pass
        assert time.monotonic() - killed < 5.0
        assert loader.child_pids() == {}, "the failed pipeline was stopped at once"
        assert wait_gone(list(pids.values()), timeout_s=0.0) == []


@pytest.mark.parametrize("persistent", [True, False])
def test_close_leaves_no_live_child(persistent: bool) -> None:
    loader = _loader(SyntheticChatDataset.seeded(400), persistent_workers=persistent)
    batches = iter(loader)
    next(batches)
    pids = list(loader.child_pids().values())
    assert len(pids) == 3
    started = time.monotonic()
    loader.close()
    assert time.monotonic() - started < 5.0
    assert wait_gone(pids, timeout_s=0.0) == []
    assert loader.child_pids() == {}


def test_dataset_exception_names_index_and_cause() -> None:
    loader = _loader(SyntheticChatDataset.seeded(200, fail_index=7))
    with loader, pytest.raises(SampleFetchError, match=r"dataset\[7\] raised ZeroDivisionError"):
        list(loader)


def test_bad_sample_raises_naming_index_and_field() -> None:
    loader = _loader(SyntheticChatDataset.seeded(200, bad_indices=frozenset({11})))
    with loader, pytest.raises(BadSampleError, match=r"sample 11: field 'input_ids' is empty"):
        list(loader)


def test_bad_samples_skipped_and_counted() -> None:
    bad = frozenset({3, 11, 150})
    loader = _loader(SyntheticChatDataset.seeded(200, bad_indices=bad), on_bad_sample="skip")
    with loader:
        emitted = [i for batch in loader for i in batch.meta.sample_ids]
    stats = loader.last_epoch_stats
    assert stats is not None
    assert sorted(stats.skipped_ids) == sorted(bad)
    assert sorted(emitted) == sorted(set(range(200)) - bad)
    assert stats.emitted_samples == 197 and stats.dropped == 0


def _two_ranks(**fields: object) -> RankJob:
    dataset = fields.pop("dataset", SyntheticChatDataset.seeded(600))
    loader = {**LOADER, "num_workers": 1, **fields.pop("loader", {})}  # type: ignore[dict-item]
    return RankJob(dataset, loader, weights=(1, 3), **fields)  # type: ignore[arg-type]


def test_dataset_exception_on_one_rank_fails_every_rank() -> None:
    lengths = SyntheticChatDataset.seeded(600).lengths
    shortest = min(range(600), key=lambda i: (lengths[i], -i))  # in rank 1's shard
    job = _two_ranks(dataset=SyntheticChatDataset(lengths, fail_index=shortest))
    outcome = run_ranks(job, world_size=2)
    assert outcome.ok == {}
    assert outcome.errors[1][0] == "SampleFetchError"
    assert f"dataset[{shortest}] raised ZeroDivisionError" in outcome.errors[1][1]
    assert outcome.errors[0][0] == PeerFailedError.__name__
    assert "rank(s) [1] failed" in outcome.errors[0][1]


def test_ranks_with_different_settings_fail_fast_naming_the_field() -> None:
    job = _two_ranks(rank_kwargs={1: {"token_budget": 700}})
    outcome = run_ranks(job, world_size=2, timeout_s=30)
    assert outcome.ok == {}
    for rank in range(2):
        name, message, _ = outcome.errors[rank]
        assert name == "SettingsMismatchError"
        assert "'token_budget' (rank 0: 600, rank 1: 700)" in message


def test_killed_rank_fails_its_peer_and_leaves_no_orphan() -> None:
    job = _two_ranks(kill_rank=1, loader={"alignment_timeout_s": 10.0, "num_workers": 2})
    outcome = run_ranks(job, world_size=2, timeout_s=60)
    assert outcome.killed_at is not None
    name, message, failed_at = outcome.errors[0]
    assert name == MetadataChannelError.__name__
    assert "the ODB metadata channel" in message and "rank 0" in message
    assert failed_at - outcome.killed_at < 10.0 + 2.0
    orphans = list(outcome.pids[1].values())
    assert len(orphans) == 3
    assert wait_gone(orphans, timeout_s=10.0) == []


def test_stuck_sample_times_out_and_aborts_the_peers() -> None:
    lengths = SyntheticChatDataset.seeded(600).lengths
    shortest = min(range(600), key=lambda i: (lengths[i], -i))  # in rank 1's shard
    job = _two_ranks(
        dataset=SyntheticChatDataset(lengths, hang_index=shortest),
        loader={"timeout_s": 2.0, "alignment_timeout_s": 30.0},
    )
    outcome = run_ranks(job, world_size=2)
    name, message, _ = outcome.errors[1]
    assert name == "SampleTimeoutError"
    assert "no sample arrived from the workers within timeout_s=2.0" in message
    assert f"in flight, oldest first: index {shortest} (worker 0)" in message
    assert outcome.errors[0][0] == PeerFailedError.__name__


def test_silent_peer_times_out_naming_the_channel_rank_and_round() -> None:
    message, waited_s = run_silent_peer()
    assert message.startswith("the ODB metadata channel (127.0.0.1:")
    assert "/odb/silent/0) failed on rank 0 at round 7" in message
    assert 2.0 <= waited_s < 6.0
