"""Failures end every rank with an error that names what failed, within bounded time,
and leave no child process behind: single-rank checks, then the 2-rank fault matrix
(:mod:`odb_lightning.testing.fault_matrix`: a worker, the collate process or a whole rank
killed, a sample that hangs or raises, with ``on_bad_sample`` raise and skip)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from odb_lightning.runtime import (
    BadSampleError,
    LoaderProcessError,
    ODBLoader,
    SampleFetchError,
)
from odb_lightning.runtime.pipeline import STALL_GRACE_S
from odb_lightning.testing.datasets import SyntheticChatDataset
from odb_lightning.testing.fault_matrix import (
    ERROR_BOUND_S,
    HANG_TIMEOUT_S,
    NUM_SAMPLES,
    LoaderFault,
    matrix,
    rank1_sample,
    run_fault,
)
from odb_lightning.testing.processes import wait_gone
from odb_lightning.testing.ranks import RankJob, run_ranks, run_silent_peer

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


def _stuck_collate(samples: list[dict]) -> dict:
    threading.Event().wait()  # a collate function that never returns
    raise AssertionError("unreachable")


def test_stuck_collate_function_is_detected_naming_the_process() -> None:
    loader = _loader(
        SyntheticChatDataset.seeded(200),
        collate_fn=_stuck_collate,
        timeout_s=1.0,
        alignment_timeout_s=1.0,
    )
    before = {child.pid for child in psutil.Process().children()}
    with loader:
        started = time.monotonic()
        with pytest.raises(
            LoaderProcessError,
            match=r"the ODB collate process \(pid \d+\) of rank 0 made no progress for 7s",
        ):
            next(iter(loader))
        waited_s = time.monotonic() - started
        assert 1.0 + 1.0 + STALL_GRACE_S <= waited_s < 1.0 + 1.0 + STALL_GRACE_S + 3.0
        assert loader.child_pids() == {}
    assert {child.pid for child in psutil.Process().children()} <= before  # all stopped


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


def test_ranks_with_different_settings_fail_fast_naming_the_field() -> None:
    job = _two_ranks(rank_kwargs={1: {"token_budget": 700}})
    outcome = run_ranks(job, world_size=2, timeout_s=30)
    assert outcome.ok == {}
    for rank in range(2):
        name, message, _ = outcome.errors[rank]
        assert name == "SettingsMismatchError"
        assert "'token_budget' (rank 0: 600, rank 1: 700)" in message


@pytest.mark.parametrize("fault", matrix(), ids=lambda fault: fault.name)
def test_fault_on_one_rank_fails_every_rank_and_leaves_no_process(
    fault: LoaderFault, tmp_path: Path
) -> None:
    result = run_fault(fault, tmp_path)
    assert result.mismatches == [], result.errors
    assert result.job_pids == 2 * (1 + 3)  # each rank: itself, 2 workers, collate process
    assert result.leftover_pids == []
    assert result.seconds_to_all_gone is not None
    bound_s = ERROR_BOUND_S
    if fault.name == "sample_hangs":  # the error is due timeout_s after the hang
        bound_s = HANG_TIMEOUT_S + 5.0
        assert min(result.seconds_to_error.values()) >= HANG_TIMEOUT_S
    assert all(seconds < bound_s for seconds in result.seconds_to_error.values())
    if fault.expected:
        return
    # on_bad_sample=skip: both ranks finish; the raising sample is skipped and counted.
    index = rank1_sample()
    epochs = {rank: records[0] for rank, records in result.completed.items()}
    assert epochs[1]["stats"].skipped_ids == (index,) and epochs[0]["stats"].skipped_ids == ()
    emitted = [i for e in epochs.values() for step in e["steps"] for i in step["meta"].sample_ids]
    assert sorted(emitted) == sorted(set(range(NUM_SAMPLES)) - {index})  # the rest, once


def test_silent_peer_times_out_naming_the_channel_rank_and_round() -> None:
    message, waited_s = run_silent_peer()
    assert message.startswith("the ODB metadata channel (127.0.0.1:")
    assert "/odb/silent/0, Gloo on local address 127.0.0.1) failed on rank 0 at round 7" in message
    assert 2.0 <= waited_s < 6.0
