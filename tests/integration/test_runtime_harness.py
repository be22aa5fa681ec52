"""Multi-rank harness for the runtime tests (this module holds no tests).

Ranks are separate processes, each with a real gloo default group, started from a
forkserver that has torch preloaded: forking from it costs milliseconds, where a spawned
rank would pay a torch import (seconds on two cores). Each rank runs an ``ODBLoader``
and reports what it yielded, or the error it raised, on a queue; with a fault it also
reports the PIDs of itself and every descendant before the fault, so a test can check
that none of them outlives it, and the ``time.monotonic()`` of the fault (the clock is
system-wide on Linux, so times from different processes compare).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from odb_lightning.core.settings import LoaderSettings
from odb_lightning.core.simulate import simulate
from odb_lightning.runtime import MetadataChannelError, ODBLoader, Rendezvous
from odb_lightning.runtime.exchange import open_channel

IGNORE = -100


class SyntheticChatDataset:
    """Seeded token lengths; the first third of each sample is an unsupervised prompt.

    Args:
        lengths: Token length of each sample.
        fail_index: ``dataset[fail_index]`` raises ``ZeroDivisionError``.
        bad_indices: These samples have empty ``input_ids``.
        hang_index: ``dataset[hang_index]`` never returns.
        fault_marker: File where the fetch of ``fail_index`` or ``hang_index`` writes its
            ``time.monotonic()`` first (see :func:`read_fault_marker`).
    """

    def __init__(
        self,
        lengths: list[int],
        fail_index: int | None = None,
        bad_indices: frozenset[int] = frozenset(),
        hang_index: int | None = None,
        fault_marker: str | None = None,
    ) -> None:
        self.lengths = lengths
        self.fail_index = fail_index
        self.bad_indices = bad_indices
        self.hang_index = hang_index
        self.fault_marker = fault_marker

    @classmethod
    def seeded(cls, n: int, seed: int = 0, **kwargs: Any) -> SyntheticChatDataset:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, 300, (n,), generator=generator).tolist()
        return cls(lengths, **kwargs)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index in (self.fail_index, self.hang_index) and self.fault_marker is not None:
            Path(self.fault_marker).write_text(repr(time.monotonic()))
        if index == self.fail_index:
            raise ZeroDivisionError(f"synthetic failure in sample {index}")
        if index == self.hang_index:
            threading.Event().wait()  # a stuck sample: only terminating the worker ends it
        if index in self.bad_indices:
            return {"input_ids": torch.zeros(0, dtype=torch.long)}
        length = self.lengths[index]
        input_ids = (torch.arange(length) * 7 + index) % 1000
        labels = input_ids.clone()
        labels[: length // 3] = IGNORE
        return {"input_ids": input_ids, "labels": labels}

    def num_loss_tokens(self, index: int) -> int:
        length = self.lengths[index]
        return length - max(1, length // 3)


@dataclass(frozen=True)
class SkewedShard:
    """Rank-skewed, unequal shards: sorted by length, rank ``r`` takes a contiguous slice
    of size proportional to ``weights[r]`` (rank 0 the longest), shuffled per epoch."""

    lengths: tuple[int, ...]
    weights: tuple[int, ...]
    rank: int
    seed: int = 0

    def __call__(self, epoch: int) -> list[int]:
        by_length = sorted(range(len(self.lengths)), key=lambda i: (-self.lengths[i], i))
        total = sum(self.weights)
        bounds = [
            len(by_length) * sum(self.weights[:r]) // total for r in range(len(self.weights) + 1)
        ]
        indices = by_length[bounds[self.rank] : bounds[self.rank + 1]]
        generator = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        return [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]


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
    """

    dataset: SyntheticChatDataset
    loader_kwargs: dict[str, Any]
    rank_kwargs: dict[int, dict[str, Any]] = field(default_factory=dict)
    weights: tuple[int, ...] | None = None
    epochs: int = 1
    kill: Kill | None = None
    probe_resources: bool = False


def descendant_pids(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid``."""
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def resource_sample() -> dict[str, int]:
    """This process's open file descriptors and RSS, its live descendants and the largest
    RSS among them, and the PSS of it and them together (proportional set size: forked
    children share most pages with their parent; a sum of RSS would count them twice)."""
    me = psutil.Process()
    children = me.children(recursive=True)
    pss, child_rss = me.memory_full_info().pss, [0]
    for child in children:
        try:
            memory = child.memory_full_info()
        except psutil.NoSuchProcess:
            continue  # exited since the listing: it holds no memory any more
        pss += memory.pss
        child_rss.append(memory.rss)
    return {
        "open_fds": me.num_fds(),
        "children": len(children),
        "rss_bytes": me.memory_info().rss,
        "max_child_rss_bytes": max(child_rss),
        "tree_pss_bytes": pss,
    }


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


def _run_loader(rank: int, job: RankJob, results: Any) -> list[dict[str, Any]]:
    kwargs = {**job.loader_kwargs, **job.rank_kwargs.get(rank, {})}
    if job.weights is not None:
        kwargs["shard"] = SkewedShard(tuple(job.dataset.lengths), job.weights, rank)
    kill = job.kill if job.kill is not None and job.kill.rank == rank else None
    epochs = []
    with ODBLoader(job.dataset, **kwargs) as loader:
        for epoch in range(job.epochs):
            loader.set_epoch(epoch)
            steps = []
            pids = loader.child_pids()
            resources = {}
            for batch in loader:
                steps.append(_record(batch))
                if len(steps) == 1:
                    pids = pids or loader.child_pids()
                    if epoch == 0:  # every process of this rank, before any fault
                        own = os.getpid()
                        results.put(("pids", rank, [own, *descendant_pids(own)]))
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
                }
            )
    return epochs


def rank_main(rank: int, world_size: int, store_port: int, job: RankJob, results: Any) -> None:
    """One rank: join the default gloo group, run the loader, report."""
    store = dist.TCPStore("127.0.0.1", store_port, world_size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        results.put(("ok", rank, _run_loader(rank, job, results)))
    except Exception as error:  # reported to the test, which asserts on it
        results.put(("error", rank, type(error).__name__, str(error), time.monotonic()))
    finally:
        dist.destroy_process_group()


def silent_peer_main(rank: int, port: int, results: Any, release: Any) -> None:
    """Both ranks open a channel; rank 0 then all-gathers alone until it times out."""
    rendezvous = Rendezvous("127.0.0.1", port, rank, 2, prefix="silent")
    settings = LoaderSettings(token_budget=64, outstanding_depth=4)
    channel = open_channel(settings, rendezvous, generation=0, timeout_s=2.0)
    if rank == 1:
        release.get(timeout=60)  # stays connected but silent until the test is done
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
        return results.get(timeout=60)
    finally:
        release.put("done")
        for process in ranks:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


@dataclass
class RankOutcome:
    """What the test process collected from the ranks.

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
    context.set_forkserver_preload(["torch", "test_runtime_harness"])
    return context


def run_ranks(job: RankJob, world_size: int, timeout_s: float = 60.0) -> RankOutcome:
    """Run ``job`` on ``world_size`` ranks; every rank is joined or killed before return."""
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
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join(5)
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


def read_fault_marker(path: Path) -> float:
    """The ``time.monotonic()`` a dataset wrote when it reached its fault index."""
    return float(path.read_text())


def expected_steps(job: RankJob, world_size: int, epoch: int) -> list[list[list[int]]]:
    """``core.simulate`` on the ranks' shards, mapped to dataset indices."""
    dataset = job.dataset
    shards = [
        SkewedShard(tuple(dataset.lengths), job.weights, rank)(epoch) for rank in range(world_size)
    ]
    kwargs = job.loader_kwargs
    steps = simulate(
        [[dataset.lengths[i] for i in shard] for shard in shards],
        token_budget=kwargs["token_budget"],
        window=kwargs["outstanding_depth"],
        join=kwargs.get("join", True),
        seed=kwargs.get("seed", 0),
        max_steps_per_round=kwargs.get("max_steps_per_round", 8),
        loss_tokens=[[dataset.num_loss_tokens(i) for i in shard] for shard in shards],
        epoch=epoch,
    )
    return [
        [[shard[p] for p in step] for step in rank_steps]
        for shard, rank_steps in zip(shards, steps, strict=True)
    ]


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """PIDs still running after up to ``timeout_s`` seconds (zombies count as gone)."""
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if not _gone(p)]
    while alive and time.monotonic() < deadline:
        psutil.wait_procs(alive, timeout=0.2)
        alive = [p for p in alive if not _gone(p)]
    return [p.pid for p in alive]
