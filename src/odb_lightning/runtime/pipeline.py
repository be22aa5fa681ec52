"""The processes of one rank's loader and the queues between them, owned by the main
process: N workers and one collate process, started together and stopped together."""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import queue
import time
from collections.abc import Generator, Sequence
from multiprocessing.process import BaseProcess

import torch

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import DataHandshake
from odb_lightning.core.signals import signals_held
from odb_lightning.runtime.batch import CollateFn, ODBBatch
from odb_lightning.runtime.collate_process import CollateProcessSpec, collate_main
from odb_lightning.runtime.errors import LoaderProcessError, RemoteTraceback
from odb_lightning.runtime.lifecycle import describe_exit, exited_child, stop_processes
from odb_lightning.runtime.messages import (
    CollateFailed,
    EpochEnd,
    EpochStart,
    Shutdown,
    StopWorker,
)
from odb_lightning.runtime.rendezvous import Rendezvous
from odb_lightning.runtime.stats import EpochStats
from odb_lightning.runtime.stream_source import RankStream
from odb_lightning.runtime.worker import MapDataset, worker_main
from odb_lightning.sample import SampleLimits

POLL_S = 0.1
"""How often the main process checks its children's liveness while it waits."""
EXIT_WAIT_S = 2.0
"""How long to wait for a child whose connection broke to be seen as exited."""
STALL_GRACE_S = 5.0
"""Slack for scheduling delays on top of ``timeout_s + alignment_timeout_s`` (the collate
process's bounded waits) before one that makes no progress counts as stuck."""


def start_method(config: BatchingConfig) -> str | None:
    """The start method of the loader's processes: ``batching.loader.multiprocessing_context``,
    else ``forkserver`` once CUDA is initialized in this process (a forked child would
    inherit a CUDA context it cannot use), else the platform's default."""
    method = config.loader.multiprocessing_context
    if method is not None:
        return method.value
    if torch.cuda.is_initialized() and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return None


OUTPUT_SLOTS = 64
"""Batches the collate process may have queued for the main process: enough to hide a
round's exchange and the refill of the window behind training. The steps of a round
beyond them wait uncollated (their samples are already in memory)."""


def output_slots(config: BatchingConfig) -> int:
    """Collated batches queued at most: :data:`OUTPUT_SLOTS`, or ``2 Q`` when that is
    fewer."""
    return min(OUTPUT_SLOTS, 2 * config.policy.max_steps_per_round)


def _raise_failure(message: CollateFailed) -> None:
    raise message.error from RemoteTraceback(message.traceback)


class Pipeline:
    """Worker and collate processes of one rank (see the module docstring).

    Args:
        dataset: Map-style dataset (pickled to the workers under spawn).
        rank: This rank (named in errors).
        rendezvous: Metadata channel address, ``None`` for a single rank.
        generation: Index of this pipeline's channel among those the loader opened.
        stream: The rank's part of a stream, which the collate process reads in order
            (``None``: samples are read from ``dataset``).
    """

    def __init__(
        self,
        dataset: MapDataset,
        config: BatchingConfig,
        collate_fn: CollateFn,
        *,
        rank: int,
        rendezvous: Rendezvous | None,
        generation: int,
        max_seq_len: SampleLimits | int | None,
        pad_id: int,
        data: DataHandshake | None = None,
        stream: RankStream | None = None,
    ) -> None:
        context = multiprocessing.get_context(start_method(config))
        self._rank = rank
        self._requests = [context.Queue() for _ in range(config.loader.num_workers)]
        self._results = context.Queue()
        self._commands = context.Queue()
        self._outputs = context.Queue()
        self._slots = context.Semaphore(output_slots(config))
        self._progress = context.RawValue(ctypes.c_uint64, 0)
        # Every wait of the collate process is bounded by one of the two timeouts.
        self._stall_s = config.loader.timeout_s + config.loader.alignment_timeout_s + STALL_GRACE_S
        self._workers = [
            context.Process(
                target=worker_main,
                args=(dataset, config, max_seq_len, requests, self._results),
                name=f"odb-worker-{i}",
                daemon=True,
            )
            for i, requests in enumerate(self._requests)
        ]
        spec = CollateProcessSpec(
            config, max_seq_len, pad_id, rank, rendezvous, generation, collate_fn, self._requests,
            self._results, self._commands, self._outputs, self._slots, self._progress, data,
            stream,
        )  # fmt: skip
        self._collate = context.Process(
            target=collate_main, args=(spec,), name="odb-collate", daemon=True
        )
        self._start()

    def _start(self) -> None:
        started: list[BaseProcess] = []
        try:
            with signals_held():  # each child resets its inherited handlers first
                for process in self._processes().values():
                    process.start()  # under spawn this pickles the dataset and collate_fn
                    started.append(process)
        except Exception:
            stop_processes(started, graceful=False)
            raise

    def _processes(self) -> dict[str, BaseProcess]:
        named = {f"worker {i}": worker for i, worker in enumerate(self._workers)}
        return {**named, "collate process": self._collate}

    def child_pids(self) -> dict[str, int]:
        """PID of every child, by name (``"worker 0"``, ..., ``"collate process"``)."""
        return {name: process.pid for name, process in self._processes().items()}

    def start_epoch(self, epoch: int, indices: Sequence[int]) -> None:
        self._commands.put(EpochStart(epoch, tuple(indices)))

    def next_message(self) -> ODBBatch | EpochEnd:
        """The next batch or end of epoch; raises what failed in a child.

        Raises:
            LoaderProcessError: A child died, or the collate process made no progress for
                longer than any of its bounded waits; the message names it and its pid.
            Exception: What the collate process reported (sample, channel, peer errors).
        """
        seen, seen_at = self._progress.value, time.monotonic()
        while True:
            try:
                message = self._outputs.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive()
                if self._progress.value != seen:
                    seen, seen_at = self._progress.value, time.monotonic()
                # Before its channel is up (progress 0) a spawned child may still be
                # importing: only its liveness is checked then.
                elif seen and time.monotonic() - seen_at > self._stall_s:
                    self._raise_stalled()
                continue
            except Exception:  # a batch whose sender died cannot be rebuilt: say who died
                self._await_exit()
                self._check_alive()
                raise
            if isinstance(message, CollateFailed):
                _raise_failure(message)
            if isinstance(message, ODBBatch):
                self._slots.release()
            elif isinstance(message, EpochEnd):
                # Batches of the last window may arrive without a pause, so the liveness
                # check above never ran: a child that died meanwhile is reported here.
                self._check_alive()
            return message

    def epoch_batches(self) -> Generator[ODBBatch, None, EpochStats]:
        """The epoch's batches, then its statistics, as ``EpochRunner.run`` gives them in
        process (:meth:`next_message` until the end of the epoch)."""
        while not isinstance(message := self.next_message(), EpochEnd):
            yield message
        return message.stats

    def _check_alive(self) -> None:
        exited = exited_child(self._processes())
        if exited is None:
            return
        name, process = exited
        self._raise_reported_failure()
        raise LoaderProcessError(
            f"the ODB {name} (pid {process.pid}) of rank {self._rank} "
            f"{describe_exit(process)} while the loader was running"
        )

    def _raise_stalled(self) -> None:
        self._raise_reported_failure()
        raise LoaderProcessError(
            f"the ODB collate process (pid {self._collate.pid}) of rank {self._rank} made no "
            f"progress for {self._stall_s:.0f}s (no sample received, alignment round or "
            "batch queued; each of those waits is bounded by timeout_s or "
            "alignment_timeout_s): is the collate function stuck?"
        )

    def _await_exit(self) -> None:
        """Give a child that is dying (its pipe already broke) time to be reaped."""
        by_sentinel = {process.sentinel: process for process in self._processes().values()}
        for sentinel in multiprocessing.connection.wait(list(by_sentinel), timeout=EXIT_WAIT_S):
            # Its sentinel closes before the kernel marks it exited; a join reaps it, so
            # that is_alive() is False afterwards.
            by_sentinel[sentinel].join(EXIT_WAIT_S)

    def _raise_reported_failure(self) -> None:
        """A collate process that failed reported why before exiting: raise that."""
        while True:
            try:
                message = self._outputs.get_nowait()
            except queue.Empty:
                return
            except Exception:  # batches of a dead sender: the failure is reported below
                return
            if isinstance(message, CollateFailed):
                _raise_failure(message)

    def close(self, *, graceful: bool) -> None:
        """Stop every child (bounded) and close the queues.

        Args:
            graceful: Between epochs: ask the children to exit before signalling them.
        """
        if graceful:
            self._commands.put(Shutdown())
            for requests in self._requests:
                requests.put(StopWorker())
        stop_processes(list(self._processes().values()), graceful=graceful)
        for channel in (*self._requests, self._results, self._commands, self._outputs):
            # Children are gone: do not let exit wait on a feeder thread that cannot flush.
            channel.cancel_join_thread()
            channel.close()
