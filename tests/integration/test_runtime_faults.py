"""Failures end every rank with an error that names what failed, within bounded time,
and leave no child process behind: single-rank checks, then the 2-rank fault matrix
(:mod:`testing.harness.fault_matrix`: a worker, the collate process or a whole rank
killed, a sample that hangs or raises, with ``on_bad_sample`` raise and skip)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import SettingsMismatchError
from odb_lightning.core.wire import RankReport, encode_report
from odb_lightning.runtime import (
    BadSampleError,
    LoaderProcessError,
    MetadataChannelError,
    ODBLoader,
    Rendezvous,
    SampleFetchError,
    exchange,
)
from odb_lightning.runtime.pipeline import STALL_GRACE_S
from testing.harness.datasets import SyntheticChatDataset
from testing.harness.fault_matrix import (
    NUM_SAMPLES,
    LoaderFault,
    matrix,
    rank1_sample,
    run_fault,
)
from testing.harness.processes import wait_gone
from testing.harness.ranks import RankJob, run_ranks, run_silent_peer

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
        # Found by the liveness check, the only one that names the signal (not by the
        # sample timeout, which names none).
        with pytest.raises(LoaderProcessError, match=rf"{victim} \(pid {pids[victim]}\).*SIGKILL"):
            for _ in batches:
                pass
        assert loader.child_pids() == {}, "the failed pipeline was stopped at once"
        assert wait_gone(list(pids.values()), timeout_s=0.0) == []


@pytest.mark.parametrize("persistent", [True, False])
def test_close_leaves_no_live_child(persistent: bool) -> None:
    loader = _loader(SyntheticChatDataset.seeded(400), persistent_workers=persistent)
    batches = iter(loader)
    next(batches)
    pids = list(loader.child_pids().values())
    assert len(pids) == 3
    loader.close()
    # Gone when close returns, not later (its bounded joins: test_lifecycle.py).
    assert wait_gone(pids, timeout_s=0.0) == []
    assert loader.child_pids() == {}


def _stuck_collate(entered: EventType, samples: list[dict]) -> dict:
    entered.set()
    threading.Event().wait()  # a collate function that never returns
    raise AssertionError("unreachable")


def test_stuck_collate_function_is_detected_naming_the_process() -> None:
    entered = multiprocessing.get_context("fork").Event()
    loader = _loader(
        SyntheticChatDataset.seeded(200),
        collate_fn=functools.partial(_stuck_collate, entered),
        timeout_s=1.0,
        alignment_timeout_s=1.0,
    )
    before = {child.pid for child in psutil.Process().children()}
    stall_s = 1.0 + 1.0 + STALL_GRACE_S  # the two timeouts and the grace
    with loader:
        stalled = rf"collate process \(pid \d+\) of rank 0 made no progress for {stall_s:g}s"
        with pytest.raises(LoaderProcessError, match=stalled):
            next(iter(loader))
        # The stall it named is the collate function's: entered, and never returned.
        assert entered.is_set()
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
    outcome = run_ranks(job, world_size=2)
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
    # Which wait ended each rank is in its message (the hang: "within timeout_s=2.0");
    # how long that took is experiments/faults' to time.
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
    assert waited_s >= 2.0  # the channel's timeout ran out first (later: the machine's load)


def _on_two_threads(per_rank: Callable[[Rendezvous], object]) -> list[object]:
    """``per_rank`` on 2 in-process ranks (threads) meeting on a fresh store; each entry:
    the rank's return value or the exception it raised."""
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    outcomes: list[object] = [None, None]

    def run(rank: int) -> None:
        try:
            outcomes[rank] = per_rank(Rendezvous("127.0.0.1", store.port, rank, 2, "agree"))
        except Exception as error:  # asserted on by the caller
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)  # against a hang only
    assert not any(thread.is_alive() for thread in threads), outcomes
    return outcomes


def _epoch_ids(datasets: list[SyntheticChatDataset], **kwargs: object) -> list[object]:
    def per_rank(rendezvous: Rendezvous) -> object:
        loader = _loader(datasets[rendezvous.rank], num_workers=0, rendezvous=rendezvous, **kwargs)
        with loader:
            return sorted(i for batch in loader for i in batch.meta.sample_ids)

    return _on_two_threads(per_rank)


def test_ranks_with_different_dataset_lengths_fail_naming_the_lengths() -> None:
    outcomes = _epoch_ids([SyntheticChatDataset.seeded(50), SyntheticChatDataset.seeded(60)])
    for error in outcomes:
        assert isinstance(error, SettingsMismatchError), outcomes
        assert str(error).startswith("ranks disagree on len(dataset): rank 0: 50, rank 1: 60;")


def test_overlapping_shard_functions_fail_naming_the_shard_sizes() -> None:
    dataset = SyntheticChatDataset.seeded(50)
    outcomes = _epoch_ids(
        [dataset, dataset], shard=lambda epoch: list(range(30)), shard_dealing="fixed"
    )
    for error in outcomes:
        assert isinstance(error, SettingsMismatchError), outcomes
        assert "overlap in epoch 0: shard sizes (rank 0: 30, rank 1: 30) sum to 60" in str(error)
    # Disjoint shards that cover the dataset pass the same check.
    halves = [list(range(0, 50, 2)), list(range(1, 50, 2))]
    ids = _on_two_threads(
        lambda rendezvous: sorted(
            i
            for batch in _loader(
                dataset,
                num_workers=0,
                rendezvous=rendezvous,
                shard=lambda epoch: halves[rendezvous.rank],
                shard_dealing="fixed",
            )
            for i in batch.meta.sample_ids
        )
    )
    assert ids == halves


def test_malformed_report_on_the_channel_fails_naming_the_rank_and_round() -> None:
    config = BatchingConfig.of(token_budget=64, max_steps_per_round=4, alignment_timeout_s=5.0)
    good = encode_report(RankReport(0, 7, False, False, 4, 3, 2, (1, 2), (5, 6)), 4)
    garbage = [*good[:7], 1 << 40, *good[8:]]  # num_groups: what sized std::bad_alloc

    def per_rank(rendezvous: Rendezvous) -> object:
        channel = exchange.open_channel(config, rendezvous, generation=0)
        try:
            return channel.allgather(garbage if rendezvous.rank else good, "epoch 0 round 7")
        finally:
            channel.close()

    for error in _on_two_threads(per_rank):
        assert isinstance(error, MetadataChannelError)
        assert "the message of rank 1 at epoch 0 round 7 is malformed (num_groups is " in str(error)


def test_a_foreign_client_writing_into_the_channel_keys_fails_every_rank_naming_the_key() -> None:
    """torch's store has no authentication: a local process that reaches MASTER_PORT
    writes garbage into the keys of the channel's Gloo group (which it can list) before
    the ranks do. Every rank refuses the key it finds occupied, naming it, at once."""
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    foreign = dist.TCPStore("127.0.0.1", store.port, None, is_master=False)
    for rank in range(2):
        foreign.set(f"odb/victim/0/0/{rank}", b"\xff" * 64)
    config = BatchingConfig.of(token_budget=64, alignment_timeout_s=20.0)
    outcomes: list[object] = [None, None]

    def run(rank: int) -> None:
        try:
            rendezvous = Rendezvous("127.0.0.1", store.port, rank, 2, "victim")
            outcomes[rank] = exchange.open_channel(config, rendezvous, generation=0)
        except Exception as error:  # asserted on below
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)  # a bound on a hang, not a timing: each rank fails at its first write
    assert not any(thread.is_alive() for thread in threads), outcomes
    for rank, error in enumerate(outcomes):
        assert isinstance(error, MetadataChannelError), error
        assert f"the job store's key 'odb/victim/0/0/{rank}' already holds 64 bytes" in str(error)
        assert "which this rank did not write" in str(error)
        assert "docs/reliability.md" in str(error)


def test_worker_processes_check_the_data_too() -> None:
    """The collate process (num_workers > 0) runs the same data handshake."""
    job = _two_ranks(rank_kwargs={1: {"max_seq_len": 2048}})
    outcome = run_ranks(job, world_size=2)
    assert outcome.ok == {}
    for rank in range(2):
        name, message, _ = outcome.errors[rank]
        assert name == "SettingsMismatchError", message
        assert message.startswith("ranks disagree on max_seq_len: rank 0: "), message
        assert "rank 1: 2048" in message


def test_a_worker_killed_in_the_last_window_is_reported_at_the_epoch_end() -> None:
    """The last window's batches can arrive without a pause, so the liveness poll never
    runs; the end of the epoch checks every child.

    The test waits for the event that check reads, the worker's sentinel (its end of the
    pipe closed by the kernel), not for a zombie state: a killed process's main thread
    shows as a zombie while its other threads (the queue feeder, the parent watch) are
    still exiting and still hold its file descriptors, and on a loaded machine the epoch
    end could come first.
    """
    import multiprocessing
    import multiprocessing.connection

    dataset = SyntheticChatDataset.seeded(40)
    # spawn: this process may hold threads of earlier tests, which a forked child inherits.
    settings = {"num_workers": 1, "outstanding_depth": 64, "multiprocessing_context": "spawn"}
    with _loader(dataset, **settings) as loader:
        batches = iter(loader)
        next(batches)  # the whole epoch fits one window: every sample is fetched by now
        (pid,) = [p for n, p in loader.child_pids().items() if n.startswith("worker")]
        (worker,) = [p for p in multiprocessing.active_children() if p.pid == pid]
        os.kill(pid, signal.SIGKILL)
        # Bounded: a SIGKILLed process always exits; 60 s only fails a broken machine.
        assert multiprocessing.connection.wait([worker.sentinel], timeout=60), "never exited"
        with pytest.raises(LoaderProcessError, match=r"the ODB worker 0 \(pid \d+\) of rank 0 "):
            for _ in batches:
                pass
