"""One rank's epoch: fill the window, align a round with the other ranks, collate its
steps. The same code runs in the collate process and, with ``num_workers=0``, in the
main process; only where samples come from and where batches go differ.

Determinism: a round starts only when the window is ready (every requested sample has
arrived), and every window publishes ``free_slots = Q``. What a round sees
therefore never depends on timing, and the steps equal the simulator's for the same
inputs (:func:`odb_lightning.core.simulate.simulate_epoch` for fixed shards,
:func:`~odb_lightning.core.simulate.simulate_dealt_epoch` dealt by need, each given the
samples' serialized sizes when ``window_max_mib`` binds). Back-pressure is per batch:
each step takes an output slot before it is collated, so a round of many steps waits,
uncollated, for the consumer. Dealt by need, the round after an emitting one (it deals
the refill, as every window now lacks work) runs before that round's steps are collated,
so the workers fetch the next window while the steps are collated and trained.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from odb_lightning.core.alignment import AlignmentError, PeerFailedError
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import SettingsMismatchError
from odb_lightning.core.types import SampleInfo
from odb_lightning.core.window import GroupingWindow, RoundOutcome, Step, exchange_round
from odb_lightning.core.wire import encode_report
from odb_lightning.runtime.batch import CollateFn, ODBBatch, idle_samples, make_step_meta
from odb_lightning.runtime.errors import (
    MetadataChannelError,
    RemoteTraceback,
    SampleFetchError,
)
from odb_lightning.runtime.exchange import Channel
from odb_lightning.runtime.messages import (
    FetchedSample,
    FetchRequest,
    FetchResult,
    SampleFailed,
    SampleSkipped,
)
from odb_lightning.runtime.stats import EpochStats
from odb_lightning.runtime.transport import MovedBytesError, load_sample, pack_moved, unpack_moved
from odb_lightning.runtime.worker import MapDataset, fetch_sample
from odb_lightning.sample import BadSampleError

SHARED_FAILURES = (MetadataChannelError, PeerFailedError, AlignmentError, SettingsMismatchError)
"""Errors every rank already sees (or that broke the channel): no abort report is sent."""


class SampleSource(Protocol):
    """Where the window's samples come from."""

    def submit(self, request: FetchRequest) -> None: ...

    def receive(self) -> FetchResult:
        """The next result, in any order; raises after the source's timeout."""
        ...


class OutputSlots(Protocol):
    """Room for batches between the round loop and the consumer."""

    def acquire(self, count: int) -> None: ...

    def release(self, count: int) -> None: ...


class InlineSource:
    """``num_workers=0``: each sample is fetched in this process when it is received."""

    def __init__(
        self, dataset: MapDataset, config: BatchingConfig, max_seq_len: int | None
    ) -> None:
        self._dataset = dataset
        self._config = config
        self._max_seq_len = max_seq_len
        self._pending: deque[FetchRequest] = deque()

    def submit(self, request: FetchRequest) -> None:
        self._pending.append(request)

    def receive(self) -> FetchResult:
        return fetch_sample(
            self._dataset,
            self._pending.popleft(),
            self._config.loader.on_bad_sample,
            self._max_seq_len,
        )


class InlineSlots:
    """The consumer is the caller of the round loop itself: slots are always free."""

    def acquire(self, count: int) -> None:
        """Nothing to wait for."""

    def release(self, count: int) -> None:
        """Nothing to give back."""


_MOVED = struct.Struct("<qq")
"""The frame of one moved sample's payload: its position in the epoch's order, its size."""


@dataclass
class _EpochLog:
    epoch: int
    started: float
    payloads: dict[int, bytes] = field(default_factory=dict)
    skipped_ids: list[int] = field(default_factory=list)
    round_latency_s: list[float] = field(default_factory=list)
    window_fill_s: float | None = None
    steps: int = 0
    idle_steps: int = 0
    unsupervised: int = 0  # fetched samples without a supervised token
    truncated: int = 0  # fetched samples their dataset cut to max_seq_len
    image_tokens: int = 0  # emitted samples' tokens that stand for images
    image_patches: int = 0  # emitted samples' ViT patches
    moved_samples: int = 0  # samples run here that another rank fetched (pooled rounds)
    moved_bytes: int = 0  # the bytes they crossed the channel in (compressed)
    fetch_wait_s: float = 0.0  # waited for this rank's own samples (fetch_aware_dealing)

    def finish(self, window: GroupingWindow) -> EpochStats:
        return EpochStats(
            epoch=self.epoch,
            emitted_samples=window.num_emitted,
            steps=self.steps,
            idle_steps=self.idle_steps,
            dropped=window.num_dropped,
            skipped_ids=tuple(self.skipped_ids),
            over_budget=window.num_over_budget,
            over_patch_budget=window.num_over_patch_budget,
            rounds=len(self.round_latency_s),
            round_latency_s=tuple(self.round_latency_s),
            window_fill_s=self.window_fill_s or 0.0,
            unsupervised=self.unsupervised,
            truncated=self.truncated,
            image_tokens=self.image_tokens,
            image_patches=self.image_patches,
            moved_samples=self.moved_samples,
            fetched_samples=window.num_received - window.num_skipped,
            moved_bytes=self.moved_bytes,
        )


class EpochRunner:
    """Runs epochs for one rank (see the module docstring).

    Args:
        config: Batching settings (identical on every rank: the handshake checked it).
        channel: The metadata exchange, already past its settings handshake.
        slots: Output capacity; each batch takes one slot just before it is collated.
        collate_fn: Builds model inputs from one step's samples.
        pad_id: Token id of the IDLE dummy sample.
    """

    def __init__(
        self,
        config: BatchingConfig,
        *,
        rank: int,
        channel: Channel,
        source: SampleSource,
        slots: OutputSlots,
        collate_fn: CollateFn,
        pad_id: int = 0,
    ) -> None:
        self._config = config
        self._pad_id = pad_id
        self._rank = rank
        self._channel = channel
        self._source = source
        self._slots = slots
        self._collate_fn = collate_fn

    def run(self, epoch: int, indices: Sequence[int]) -> Generator[ODBBatch, None, EpochStats]:
        """Yield the epoch's batches, then return its statistics.

        A local failure (a sample, the collate function, a timeout) is published as an
        abort report in the next round, so every peer raises ``PeerFailedError`` instead
        of waiting or finishing cleanly; then it is re-raised here.
        """
        window = GroupingWindow(self._config, len(indices), rank=self._rank, epoch=epoch)
        log = _EpochLog(epoch=epoch, started=time.monotonic())
        try:
            yield from self._rounds(window, indices, log)
        except SHARED_FAILURES:
            raise
        except Exception as error:
            self._publish_abort(window, error)
            raise
        return log.finish(window)

    def _rounds(
        self, window: GroupingWindow, indices: Sequence[int], log: _EpochLog
    ) -> Iterator[ODBBatch]:
        pending: deque[Step] = deque()
        while True:
            self._fill(window, indices, log)
            outcome = self._align(window, log)
            if outcome.epoch_over:
                break
            # Ask for the next window's samples before collating, so workers overlap.
            self._request(window, indices)
            pending.extend(outcome.steps)
            if outcome.steps and window.num_undealt:
                # Dealt by need, the refill is dealt next: run that round first. Every
                # rank takes this branch in the same round (T and the undealt count are
                # the same on every rank), so the rounds stay in step.
                continue
            while pending:
                yield self._collate(pending.popleft(), log)
        while pending:
            yield self._collate(pending.popleft(), log)

    def _request(self, window: GroupingWindow, indices: Sequence[int]) -> None:
        for position in window.request():
            self._source.submit(FetchRequest(position, indices[position], window.epoch))

    def _fill(self, window: GroupingWindow, indices: Sequence[int], log: _EpochLog) -> None:
        while True:
            self._request(window, indices)  # also refills the room a skipped sample left
            if window.is_ready():
                break
            waiting = time.monotonic()
            result = self._source.receive()
            log.fetch_wait_s += time.monotonic() - waiting
            if isinstance(result, FetchedSample):
                info = SampleInfo(
                    result.dataset_index,
                    result.length,
                    result.num_loss_tokens,
                    result.position,
                    num_patches=result.num_patches,
                    num_image_tokens=result.num_image_tokens,
                    patch_square_sum=result.patch_square_sum,
                    num_bytes=len(result.payload),
                )
                window.add(info)
                log.payloads[result.position] = result.payload
                log.unsupervised += result.num_loss_tokens == 0
                log.truncated += result.truncated
            elif isinstance(result, SampleSkipped):
                window.skip(result.position)
                log.skipped_ids.append(result.dataset_index)
            else:
                self._raise_sample_failure(result)
        if log.window_fill_s is None:
            log.window_fill_s = time.monotonic() - log.started

    def _raise_sample_failure(self, result: SampleFailed) -> None:
        where = f"(on rank {self._rank})"
        if result.bad_sample:
            problem = f"{result.problem} {where}"
            error: Exception = BadSampleError(result.dataset_index, result.field, problem)
        else:
            error = SampleFetchError(f"{result.message} {where}")
        raise error from (RemoteTraceback(result.traceback) if result.traceback else None)

    def _align(self, window: GroupingWindow, log: _EpochLog) -> RoundOutcome:
        context = f"epoch {window.epoch} round {window.round_index}"

        def exchange(message: list[int]) -> list[list[int]]:
            started = time.monotonic()
            gathered = self._channel.allgather(message, context)
            log.round_latency_s.append(time.monotonic() - started)
            return gathered

        window.wait_us = round(1e6 * log.fetch_wait_s)
        window.elapsed_us = round(1e6 * (time.monotonic() - log.started))
        outcome = exchange_round(window, exchange)
        if outcome.pooled:  # every rank's outcome is pooled alike: all take this call
            self._move(outcome, log, f"{context} (moved samples)")
        return outcome

    def _move(self, outcome: RoundOutcome, log: _EpochLog, context: str) -> None:
        """Send the payloads of the samples another rank runs to that rank, receive those
        this rank runs but another held (a pooled round, ``cross_rank_grouping``)."""
        outgoing: dict[int, list[bytes]] = {}
        for position, rank in zip(outcome.moved_out, outcome.moved_to, strict=True):
            payload = log.payloads.pop(position)
            outgoing.setdefault(rank, []).extend((_MOVED.pack(position, len(payload)), payload))
        to = {rank: pack_moved(b"".join(parts)) for rank, parts in outgoing.items()}
        wanted = set(outcome.moved_in)
        for source, wire in enumerate(self._channel.send_bytes(to, context)):
            if not wire:
                continue
            log.moved_bytes += len(wire)
            try:
                blob = unpack_moved(wire)
            except MovedBytesError as error:
                raise AlignmentError(
                    f"rank {self._rank} at {context}: from rank {source}, {error}"
                ) from error
            offset = 0
            while offset < len(blob):
                position, size = _MOVED.unpack_from(blob, offset)
                offset += _MOVED.size
                if position not in wanted or offset + size > len(blob):
                    raise AlignmentError(
                        f"rank {self._rank} at {context}: rank {source} sent position "
                        f"{position} ({size} bytes), which the pooled plan does not move here"
                    )
                log.payloads[position] = blob[offset : offset + size]
                offset += size
        missing = sorted(wanted - log.payloads.keys())
        if missing:
            raise AlignmentError(
                f"rank {self._rank} at {context}: no payload arrived for positions {missing[:5]}"
            )
        log.moved_samples += len(wanted)

    def _collate(self, step: Step, log: _EpochLog) -> ODBBatch:
        self._slots.acquire(1)
        if step.group is None:
            samples = idle_samples(self._pad_id)
        else:
            samples = [load_sample(log.payloads.pop(s.position)) for s in step.group.samples]
            log.image_tokens += sum(s.num_image_tokens for s in step.group.samples)
            log.image_patches += sum(s.num_patches for s in step.group.samples)
        meta = make_step_meta(
            step,
            step_index=log.steps,
            epoch=log.epoch,
            rows=self._config.rows,
        )
        log.steps += 1
        log.idle_steps += int(step.is_idle)
        return ODBBatch(self._collate_fn(samples), meta)

    def _publish_abort(self, window: GroupingWindow, error: Exception) -> None:
        max_steps = self._config.policy.max_steps_per_round
        message = encode_report(window.make_abort_report(), max_steps)
        context = f"epoch {window.epoch} round {window.round_index} (abort report)"
        try:
            self._channel.allgather(message, context)
        except MetadataChannelError as channel_error:
            error.add_note(f"telling the other ranks about it also failed: {channel_error}")
