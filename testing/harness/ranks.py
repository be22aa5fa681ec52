"""A multi-rank process harness for ``ODBLoader``.

Ranks are separate processes, each with a real gloo default group, started from a
forkserver that has torch and this module preloaded: forking from it costs milliseconds,
where a spawned rank would pay a torch import (seconds on two cores). Each rank runs an
``ODBLoader`` and reports what it yielded, or the error it raised, on a queue; with a
fault it also reports the PIDs of itself and every descendant before the fault, so a
caller can check that none of them outlives it, and the ``time.monotonic()`` of the fault
(the clock is system-wide on Linux, so times from different processes compare).
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import queue
import signal
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch.distributed as dist

from odb_lightning.core.config import KNOB_NAMES, BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.simulate import simulate, simulate_dealt_epoch
from odb_lightning.runtime import MetadataChannelError, ODBLoader, Rendezvous
from odb_lightning.runtime.exchange import open_channel
from testing.harness.datasets import IGNORE, SkewedShard, SyntheticChatDataset
from testing.harness.processes import descendants, kill_alive, resource_sample


class KillTarget(StrEnum):
    """The process a :class:`Kill` fault SIGKILLs."""

    RANK = "rank"  # the rank's own main process (preemption, OOM killer)
    WORKER = "worker 0"  # one of its loader workers
    COLLATE = "collate process"  # its collate process


@dataclass(frozen=True)
class Kill:
    """Rank ``rank`` SIGKILLs ``target`` after ``after_batches`` batches of epoch 0."""

    target: KillTarget
    rank: int = 1
    after_batches: int = 2


@dataclass(frozen=True)
class RankJob:
    """What every rank runs.

    Attributes:
        dataset: The dataset.
        loader_kwargs: ``ODBLoader`` keyword arguments for every rank.
        rank_kwargs: Per-rank overrides of ``loader_kwargs``.
        weights: Shard weights for :class:`SkewedShard` (``None``: default sharding).
        epochs: Epochs to run.
        kill: A process to SIGKILL mid-epoch.
        probe_resources: Record each epoch's :func:`resource_sample` (mid-epoch and at
            its end) in the rank's results.
        rank_delays: Per rank, seconds each of its ``dataset[i]`` sleeps (a slow rank).
    """

    dataset: SyntheticChatDataset
    loader_kwargs: dict[str, Any]
    rank_kwargs: dict[int, dict[str, Any]] = field(default_factory=dict)
    weights: tuple[int, ...] | None = None
    epochs: int = 1
    kill: Kill | None = None
    probe_resources: bool = False
    rank_delays: dict[int, float] = field(default_factory=dict)


def _record(batch: Any) -> dict[str, Any]:
    inputs = batch.inputs
    return {
        "meta": batch.meta,
        "shape": tuple(inputs["input_ids"].shape),
        "loss_tokens": int((inputs["labels"][:, 1:] != IGNORE).sum()),
        "real_tokens": int(inputs["attention_mask"].sum()),
    }


def _inject(kill: Kill, loader: ODBLoader, results: Any) -> None:
    results.put(("fault", kill.rank, time.monotonic()))
    if kill.target is KillTarget.RANK:
        results.close()
        results.join_thread()  # flushed before the kill
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(loader.child_pids()[kill.target.value], signal.SIGKILL)


def _job_config(job: RankJob) -> BatchingConfig:
    """The job's batching settings; skewed shards (``weights``) are fixed shards."""
    fields = {k: v for k, v in job.loader_kwargs.items() if k in KNOB_NAMES}
    if job.weights is not None:
        fields.setdefault("shard_dealing", "fixed")
    return BatchingConfig.of(**fields)


def _run_loader(rank: int, job: RankJob, results: Any) -> list[dict[str, Any]]:
    kwargs = {**job.loader_kwargs, **job.rank_kwargs.get(rank, {})}
    if job.weights is not None:
        kwargs["shard"] = SkewedShard(tuple(job.dataset.lengths), job.weights, rank)
        kwargs.setdefault("shard_dealing", "fixed")
    kill = job.kill if job.kill is not None and job.kill.rank == rank else None
    epochs = []
    dataset = job.dataset
    if rank in job.rank_delays:
        dataset = copy.copy(dataset)
        dataset.delay_s = job.rank_delays[rank]
    with ODBLoader(dataset, **kwargs) as loader:
        for epoch in range(job.epochs):
            loader.set_epoch(epoch)
            started = time.monotonic()
            steps = []
            pids = loader.child_pids()
            resources = {}
            for batch in loader:
                steps.append(_record(batch))
                if len(steps) == 1:
                    pids = pids or loader.child_pids()
                    if epoch == 0:  # every process of this rank, before any fault
                        own = os.getpid()
                        results.put(("pids", rank, [own, *descendants(own)]))
                    if job.probe_resources:
                        resources["mid_epoch"] = resource_sample()
                if kill is not None and epoch == 0 and len(steps) == kill.after_batches:
                    _inject(kill, loader, results)
            if job.probe_resources:
                resources["epoch_end"] = resource_sample()
            shard = kwargs["shard"](epoch) if "shard" in kwargs else None
            epochs.append(
                {
                    "steps": steps,
                    "stats": loader.last_epoch_stats,
                    "shard": shard,
                    "pids": pids,
                    "resources": resources,
                    "wall_s": time.monotonic() - started,
                }
            )
    return epochs


def rank_main(rank: int, world_size: int, store_port: int, job: RankJob, results: Any) -> None:
    """One rank: join the default gloo group, run the loader, report.

    ``MASTER_ADDR``/``MASTER_PORT`` name the job store as every launcher sets them: the
    ODB loader's metadata channel meets there.
    """
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(store_port)
    store = dist.TCPStore("127.0.0.1", store_port, world_size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        results.put(("ok", rank, _run_loader(rank, job, results)))
    except Exception as error:  # reported to the caller, which asserts on it
        results.put(("error", rank, type(error).__name__, str(error), time.monotonic()))
    finally:
        dist.destroy_process_group()


def silent_peer_main(rank: int, port: int, results: Any, release: Any) -> None:
    """Both ranks open a channel; rank 0 then all-gathers alone until it times out."""
    rendezvous = Rendezvous("127.0.0.1", port, rank, 2, prefix="silent")
    config = BatchingConfig.of(token_budget=64, alignment_timeout_s=2.0)
    channel = open_channel(config, rendezvous, generation=0)
    if rank == 1:
        release.get(timeout=60)  # stays connected but silent until the caller is done
    else:
        started = time.monotonic()
        try:
            channel.allgather([1, 2, 3], "round 7")
        except MetadataChannelError as error:
            results.put((str(error), time.monotonic() - started))
    channel.close()


def run_silent_peer() -> tuple[str, float]:
    """Rank 0's channel error and how long it took, with a connected but silent peer."""
    context = _context()
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    results, release = context.Queue(), context.Queue()
    ranks = [
        context.Process(target=silent_peer_main, args=(r, store.port, results, release))
        for r in range(2)
    ]
    for process in ranks:
        process.start()
    try:
        return results.get(timeout=300)  # against a hang only: a loaded machine is slow
    finally:
        release.put("done")
        for process in ranks:
            process.join(10)
        kill_alive(ranks)


@dataclass
class RankOutcome:
    """What the calling process collected from the ranks.

    Attributes:
        ok: Per rank that finished: one record per epoch.
        errors: Per rank that raised: exception class name, message, ``time.monotonic()``.
        pids: Per rank: its own PID and every descendant's, after its first batch.
        fault_at: When the :class:`Kill` fault was injected.
    """

    ok: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[int, tuple[str, str, float]] = field(default_factory=dict)
    pids: dict[int, list[int]] = field(default_factory=dict)
    fault_at: float | None = None

    def all_pids(self) -> list[int]:
        return [pid for pids in self.pids.values() for pid in pids]


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", __name__])
    return context


def run_ranks(job: RankJob, world_size: int, timeout_s: float = 300.0) -> RankOutcome:
    """Run ``job`` on ``world_size`` ranks; every rank is joined or killed before return.
    ``timeout_s`` guards against a hang only (a loaded machine may take minutes)."""
    context = _context()
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    results = context.Queue()
    ranks = [
        context.Process(target=rank_main, args=(r, world_size, store.port, job, results))
        for r in range(world_size)
    ]
    for process in ranks:
        process.start()
    outcome = RankOutcome()
    rank_killed = job.kill is not None and job.kill.target is KillTarget.RANK
    expected = world_size - rank_killed
    deadline = time.monotonic() + timeout_s

    def waiting() -> bool:
        killed_unseen = rank_killed and outcome.fault_at is None
        return len(outcome.ok) + len(outcome.errors) < expected or killed_unseen

    try:
        while waiting():
            try:
                message = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"ranks did not finish within {timeout_s}s: {outcome}"
                ) from None
            _collect(message, outcome)
        for process in ranks:
            process.join(max(0.1, deadline - time.monotonic()))
    finally:
        kill_alive(ranks)
    return outcome


def _collect(message: tuple[Any, ...], outcome: RankOutcome) -> None:
    kind, rank = message[0], message[1]
    if kind == "ok":
        outcome.ok[rank] = message[2]
    elif kind == "error":
        outcome.errors[rank] = message[2:]
    elif kind == "pids":
        outcome.pids[rank] = message[2]
    else:
        outcome.fault_at = message[2]


def expected_steps(job: RankJob, world_size: int, epoch: int) -> list[list[list[int]]]:
    """The simulator's steps for the job, mapped to dataset indices: ``core.simulate`` on
    the ranks' :class:`SkewedShard` (or default) fixed shards, or, dealt by need,
    :func:`expected_dealt_steps`."""
    config = _job_config(job)
    if config.policy.by_need:
        return expected_dealt_steps(job, world_size, epoch)
    dataset = job.dataset
    shards = [
        SkewedShard(tuple(dataset.lengths), job.weights, rank)(epoch) for rank in range(world_size)
    ]
    patches = getattr(dataset, "patches", None)
    steps = simulate(
        [[dataset.lengths[i] for i in shard] for shard in shards],
        config,
        loss_tokens=[[dataset.num_loss_tokens(i) for i in shard] for shard in shards],
        epoch=epoch,
        patches=None if patches is None else [[patches[i] for i in shard] for shard in shards],
    )
    return [
        [[shard[p] for p in step] for step in rank_steps]
        for shard, rank_steps in zip(shards, steps, strict=True)
    ]


def expected_dealt_steps(job: RankJob, world_size: int, epoch: int) -> list[list[list[int]]]:
    """``core.simulate_dealt_epoch`` on the loader's seeded epoch order
    (``shard_dealing=by_need``, default sharding), mapped to dataset indices."""
    dataset = job.dataset
    config = _job_config(job)
    order = epoch_permutation(len(dataset), config.seed, epoch)
    result = simulate_dealt_epoch(
        [dataset.lengths[i] for i in order],
        world_size,
        config,
        loss_tokens=[dataset.num_loss_tokens(i) for i in order],
        epoch=epoch,
    )
    return [
        [[] if s.group is None else [order[m.sample_id] for m in s.group.samples] for s in steps]
        for steps in result.steps
    ]
