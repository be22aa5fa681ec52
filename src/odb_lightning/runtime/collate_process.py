"""The collate process of one rank: owns the grouping window and the metadata channel,
and runs each epoch with :class:`~odb_lightning.runtime.engine.EpochRunner`. Output
capacity is a semaphore of :func:`~odb_lightning.runtime.pipeline.output_slots` slots; each
batch takes one before it is collated and the main process releases one per batch it takes.

It counts its progress in a shared counter (a sample received, an all-gather done, a
batch queued). Each of its waits is bounded (``timeout_s`` per sample, ``alignment_timeout_s``
per exchange), so a counter that stands still for longer than both while the main
process waits means it is stuck where nothing bounds it, in the collate function: the
main process then stops it (:class:`~odb_lightning.runtime.pipeline.Pipeline`).
"""

from __future__ import annotations

import pickle
import queue
import traceback
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Semaphore
from typing import Protocol

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import DataHandshake
from odb_lightning.runtime.batch import CollateFn
from odb_lightning.runtime.engine import EpochRunner, SampleSource
from odb_lightning.runtime.errors import SampleTimeoutError
from odb_lightning.runtime.exchange import Channel, open_channel
from odb_lightning.runtime.lifecycle import prepare_child
from odb_lightning.runtime.messages import (
    CollateFailed,
    EpochEnd,
    EpochStart,
    FetchRequest,
    FetchResult,
    Shutdown,
)
from odb_lightning.runtime.rendezvous import Rendezvous
from odb_lightning.runtime.stream_source import RankStream, StreamSource
from odb_lightning.sample import SampleLimits


class ProgressCounter(Protocol):
    """A shared unsigned integer (``multiprocessing`` ``RawValue``): ``value``."""

    value: int


def count_progress(progress: ProgressCounter) -> None:
    """One more step of progress (one writer: the collate process)."""
    progress.value += 1


class WorkerQueues:
    """Sample source backed by the worker processes."""

    def __init__(
        self, requests: list[Queue], results: Queue, timeout_s: float, progress: ProgressCounter
    ) -> None:
        self._requests = requests
        self._results = results
        self._timeout_s = timeout_s
        self._progress = progress
        self._next_worker = 0
        self._in_flight: dict[int, tuple[int, int]] = {}  # position -> (index, worker)

    def submit(self, request: FetchRequest) -> None:
        worker = self._next_worker
        self._next_worker = (worker + 1) % len(self._requests)
        self._in_flight[request.position] = (request.dataset_index, worker)
        self._requests[worker].put(request)

    def receive(self) -> FetchResult:
        try:
            result: FetchResult = self._results.get(timeout=self._timeout_s)
        except queue.Empty:
            oldest = list(self._in_flight.values())[:8]  # in request order
            described = ", ".join(f"index {i} (worker {w})" for i, w in oldest)
            raise SampleTimeoutError(
                f"no sample arrived from the workers within timeout_s={self._timeout_s}; "
                f"{len(self._in_flight)} in flight, oldest first: {described}"
            ) from None
        self._in_flight.pop(result.position, None)
        count_progress(self._progress)
        return result


class ProgressChannel:
    """A channel that counts every completed exchange as progress."""

    def __init__(self, channel: Channel, progress: ProgressCounter) -> None:
        self._channel = channel
        self._progress = progress

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        gathered = self._channel.allgather(message, context)
        count_progress(self._progress)
        return gathered

    def send_bytes(self, to: dict[int, bytes], context: str) -> list[bytes]:
        received = self._channel.send_bytes(to, context)
        count_progress(self._progress)
        return received

    def close(self) -> None:
        self._channel.close()


class SemaphoreSlots:
    """Output slots shared with the main process (which releases them)."""

    def __init__(self, semaphore: Semaphore) -> None:
        self._semaphore = semaphore

    def acquire(self, count: int) -> None:
        for _ in range(count):
            self._semaphore.acquire()

    def release(self, count: int) -> None:
        for _ in range(count):
            self._semaphore.release()


@dataclass(frozen=True, slots=True)
class CollateProcessSpec:
    """Everything the collate process needs (picklable, for spawn).

    Attributes:
        rendezvous: Channel address, ``None`` for a single rank.
        generation: Index of the channel among those this loader opened.
        requests: One request queue per worker; ``results`` is shared by all workers.
        outputs: Batches and epoch ends to the main process.
        slots: The output slots (:func:`~odb_lightning.runtime.pipeline.output_slots`).
        progress: Counter of this process's progress, read by the main process.
    """

    config: BatchingConfig
    max_seq_len: SampleLimits | int | None  # the workers' sample limits
    pad_id: int
    rank: int
    rendezvous: Rendezvous | None
    generation: int
    collate_fn: CollateFn
    requests: list[Queue]
    results: Queue
    commands: Queue
    outputs: Queue
    slots: Semaphore
    progress: ProgressCounter
    data: DataHandshake | None = None  # what the channel's handshake compares of the data
    stream: RankStream | None = None  # the rank's part of a stream, read here in order


def _report_failure(outputs: Queue, error: Exception) -> None:
    """Send ``error`` to the main process; if it does not pickle, send its text."""
    try:
        pickle.loads(pickle.dumps(error))
        sent: Exception = error
    except Exception:  # arbitrary user exceptions may not survive pickling
        sent = RuntimeError(f"{type(error).__name__}: {error}")
    outputs.put(CollateFailed(sent, traceback.format_exc()))


def _serve(spec: CollateProcessSpec, channel: Channel) -> None:
    source: SampleSource = WorkerQueues(
        spec.requests, spec.results, spec.config.loader.timeout_s, spec.progress
    )
    if spec.stream is not None:
        source = StreamSource(source, spec.stream, spec.rank)
    runner = EpochRunner(
        spec.config,
        rank=spec.rank,
        channel=ProgressChannel(channel, spec.progress),
        source=source,
        slots=SemaphoreSlots(spec.slots),
        collate_fn=spec.collate_fn,
        pad_id=spec.pad_id,
    )
    while True:
        command = spec.commands.get()
        if isinstance(command, Shutdown):
            return
        if not isinstance(command, EpochStart):
            raise TypeError(f"the collate process got an unknown command {command!r}")
        batches = runner.run(command.epoch, command.indices)
        while True:
            try:
                batch = next(batches)
            except StopIteration as end:
                spec.outputs.put(EpochEnd(end.value))
                break
            spec.outputs.put(batch)
            count_progress(spec.progress)


def collate_main(spec: CollateProcessSpec) -> None:
    """Entry point of the collate process; a failure is reported to the main process."""
    prepare_child()
    try:
        channel = open_channel(spec.config, spec.rendezvous, spec.generation, spec.data)
    except Exception as error:  # reported to the main process, which raises it
        _report_failure(spec.outputs, error)
        return
    count_progress(spec.progress)
    try:
        _serve(spec, channel)
    except Exception as error:  # reported to the main process, which raises it
        _report_failure(spec.outputs, error)
        channel.close()  # peers blocked on this rank fail now, not at their timeout
        # Batches already queued share their tensors from this process, so it must
        # outlive their transfer: wait until the main process stops it.
        while not isinstance(spec.commands.get(), Shutdown):
            continue
    else:
        channel.close()
