"""``ODBLoader``: online dynamic batching as a plain iterable, for Lightning or a plain loop."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from odb_lightning.core.checks import check_int, check_positive_int
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import DataHandshake
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.runtime.batch import (
    CollateFn,
    ODBBatch,
    collate_of,
    pin_batch,
    pins_memory,
)
from odb_lightning.runtime.engine import EpochRunner, InlineSlots, InlineSource, SampleSource
from odb_lightning.runtime.exchange import Channel, open_channel
from odb_lightning.runtime.pipeline import Pipeline
from odb_lightning.runtime.rank_indices import ShardFn, epoch_indices, given_indices
from odb_lightning.runtime.rendezvous import JobRendezvous, MetadataStore, Rendezvous
from odb_lightning.runtime.resume import EpochRecord, EpochResume, gather_objects
from odb_lightning.runtime.stats import EpochStats
from odb_lightning.runtime.stream_source import (
    RankStream,
    RecordStream,
    StreamSource,
    check_streamable,
)
from odb_lightning.runtime.worker import MapDataset
from odb_lightning.sample import SampleLimits


class ODBLoader:
    """Token-budget batches formed after preprocessing, aligned across ranks (the pipeline:
    ``docs/design.md``, "One sample, from the dataset to the loss").

    Every rank yields the same number of :class:`~odb_lightning.runtime.batch.ODBBatch`
    per epoch; IDLE batches (``meta.is_idle``) keep ranks in step. There is no
    ``__len__``: the step count is known only at the end of the epoch
    (:attr:`last_epoch_stats`).

    World size and rank come from the initialized default process group, if any. With
    several ranks, building the loader is a collective (the ranks agree on the key prefix
    of their channel on the job's store) unless ``rendezvous`` is given. Call
    :meth:`set_epoch` before each epoch, as with ``DistributedSampler``, and :meth:`close`
    (or use ``with``) at the end.
    :meth:`state_dict` and :meth:`load_state_dict` give exact mid-epoch resume (the
    contract: :mod:`~odb_lightning.runtime.resume`).

    Args:
        dataset: Map-style dataset of ``{"input_ids": LongTensor[L], "labels": ...}``.
        config: The batching settings (:class:`~odb_lightning.core.config.BatchingConfig`:
            token budget, the online policy, the row layout, the loader's processes).
        collate_fn: Builds model inputs from a list of samples (default: the row
            layout's collate, :func:`~odb_lightning.runtime.batch.collate_of`).
        shard: ``shard(epoch) -> indices`` of this rank (``shard_dealing=fixed``);
            default: a seeded shuffle split by rank
            (:func:`~odb_lightning.core.order.shard_indices`).
        order: ``order(epoch) -> indices``, the epoch's global order that
            ``shard_dealing=by_need`` deals, the same on every rank; default: a seeded
            shuffle of the whole dataset (:func:`~odb_lightning.core.order.epoch_permutation`).
        rendezvous: The metadata channel's store address and this rank's place.
        metadata_store: This rank's handle on that store, which makes rank 0 fork its
            processes before the other ranks (see
            :class:`~odb_lightning.runtime.rendezvous.MetadataStore`); give it with
            ``rendezvous``. When neither is given and the default process group has
            several ranks, both come from the job's store
            (:meth:`~odb_lightning.runtime.rendezvous.JobRendezvous.connect`, a
            collective).
        stream: Read samples from a stream instead of ``dataset[i]``
            (:class:`~odb_lightning.runtime.stream_source.RecordStream`, e.g. a
            :class:`~odb_lightning.data.stream.ChatStream`): each rank's shard is its part
            of the stream, read in order, and ``dataset`` only tokenizes the records
            (``tokenize_record``). Needs ``shard_dealing=fixed`` and no ``shard=``.
        pad_id: Padding token id of the default collate and of IDLE batches.
        max_seq_len: Longer samples are bad samples (``None``: no limit).
        vocab_size: Samples with a token id (or supervised label) at or above it are bad
            samples (``None``: not checked), as are negative ids.
        **knobs: Settings by their field names that replace those of ``config``
            (:meth:`~odb_lightning.core.config.BatchingConfig.of`):
            ``ODBLoader(dataset, token_budget=8192, num_workers=2)``.
    """

    def __init__(
        self,
        dataset: MapDataset,
        config: BatchingConfig | None = None,
        *,
        collate_fn: CollateFn | None = None,
        shard: ShardFn | None = None,
        order: ShardFn | None = None,
        rendezvous: Rendezvous | None = None,
        metadata_store: MetadataStore | None = None,
        stream: RecordStream | None = None,
        pad_id: int = 0,
        max_seq_len: int | None = None,
        vocab_size: int | None = None,
        **knobs: Any,
    ) -> None:
        self.config = BatchingConfig.of(config, **knobs)
        if not self.config.policy.online:
            raise ValueError(
                f"ODBLoader forms batches online (an odb mode), got mode "
                f"{self.config.mode!r}: planned modes use PlannedLoader"
            )
        check_int("pad_id", pad_id, least=0)
        check_positive_int("max_seq_len", max_seq_len, optional=True)
        check_positive_int("vocab_size", vocab_size, optional=True)
        self.pad_id, self.max_seq_len, self.vocab_size = pad_id, max_seq_len, vocab_size
        self._limits = SampleLimits(max_seq_len, vocab_size)  # what every sample is checked on
        if collate_fn is None:
            collate_fn = collate_of(self.config.rows, pad_id)
        self.dataset = dataset
        self.collate_fn = collate_fn
        self._pin = pins_memory(self.config)
        self._policy: OnlinePolicy = self.config.policy  # type: ignore[assignment]
        if stream is not None:
            check_streamable(self._policy, shard, order)
        self._shard = given_indices(self._policy, shard, order)
        self._store = metadata_store
        timeout_s = self.config.loader.alignment_timeout_s
        job = None if rendezvous is not None else JobRendezvous.of_default_group(timeout_s)
        if job is not None:
            rendezvous, self._store = job.for_loader("loader"), job.store
        self._rendezvous = rendezvous
        self.rank = 0 if rendezvous is None else rendezvous.rank
        self.world_size = 1 if rendezvous is None else rendezvous.world_size
        self.stream: RankStream | None = None
        if stream is not None:
            self.stream = RankStream(stream, stream.part(self.world_size, self.rank))
            self._shard = self.stream.shard
        self._epoch = 0
        self._generation = 0
        self._pipeline: Pipeline | None = None
        self._channel: Channel | None = None
        self._epoch_active = False
        self._closed = False
        self._resume = EpochResume()
        self.last_epoch_stats: EpochStats | None = None

    # -- public surface ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Epoch of the next iteration (shard order, step order); equal on every rank."""
        check_int("epoch", epoch, least=0)
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (set by :meth:`set_epoch` or a loaded state)."""
        return self._epoch

    def state_dict(self, consumed_steps: int | None = None) -> dict[str, Any]:
        """Where the job stands in the epoch: its number and the samples consumed in it
        on every rank. With several ranks this is a collective: call it on every rank.

        Args:
            consumed_steps: Batches of the current epoch the caller has consumed (equal on
                every rank); ``None``: every batch yielded so far. A trainer that fetches
                ahead passes the count it has trained on.

        Returns:
            A plain dictionary for a checkpoint; a finished epoch is saved as the start
            of the next.
        """
        return self._resume.state(self._epoch, consumed_steps, self._everywhere)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration run the rest of the epoch ``state`` describes.

        The state may come from a job with another number of ranks: the rest of the
        epoch is then re-sharded (each rank leaves the consumed ids out of its shard).

        Raises:
            ResumeStateError: The state is malformed or names ids outside the dataset.
            RuntimeError: After an epoch has started and before it finished.
        """
        self._epoch = self._resume.load(state, len(self.dataset)).epoch

    def __iter__(self) -> Iterator[ODBBatch]:
        if self._closed:
            raise RuntimeError("this ODBLoader is closed; build a new one to iterate again")
        if self.config.loader.num_workers == 0:
            return self._iterate_in_process()
        return self._iterate_with_processes()

    def child_pids(self) -> dict[str, int]:
        """PIDs of the live worker and collate processes, by name (empty if none)."""
        return {} if self._pipeline is None else self._pipeline.child_pids()

    def close(self) -> None:
        """Stop every child process (bounded joins), close the channel and queues.

        Safe to call more than once; the loader cannot be iterated afterwards.
        """
        self._closed = True
        self._close_pipeline(graceful=not self._epoch_active)
        self._close_channel()
        self._store = None  # the rank-0 store server stops when released

    def __enter__(self) -> ODBLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------
    def _pinned(self, batch: ODBBatch) -> ODBBatch:
        if not self._pin:
            return batch
        return batch._replace(inputs=pin_batch(batch.inputs))

    def _indices(self, epoch: int) -> list[int]:
        place = (self.world_size, self.rank)
        seed = self.config.seed
        return epoch_indices(self._shard, self._policy, len(self.dataset), place, seed, epoch)

    def _data_handshake(self) -> DataHandshake:
        """What the channel's handshake compares across ranks (``shard=`` or ``order=``:
        this epoch's)."""
        shard = None
        if self._shard is not None and self.world_size > 1:
            shard = self._indices(self._epoch)
        by_need = self._policy.by_need
        return DataHandshake.of(
            len(self.dataset), self.max_seq_len, self._epoch, shard, order=by_need
        )

    def _begin_epoch(self, epoch: int) -> tuple[EpochRecord, list[int]]:
        """The record of this iteration and this rank's indices for ``epoch``, without
        those consumed before a resume."""
        record = self._resume.begin(epoch)
        return record, [i for i in self._indices(epoch) if i not in record.start.consumed]

    def _everywhere(self, record: EpochRecord, steps: int) -> tuple[list[int], bool]:
        """Ids of the first ``steps`` batches on every rank (one all-gather)."""
        local = [i for batch in record.yielded[:steps] for i in batch]
        rows = gather_objects((local, record.ended_with(steps)), self.world_size)
        return [i for ids, _ in rows for i in ids], all(done for _, done in rows)

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def _close_pipeline(self, *, graceful: bool) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.close(graceful=graceful)

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _start_pipeline(self, generation: int) -> Pipeline:
        """The worker and collate processes of ``generation``; rank 0 forks first."""
        ordered: AbstractContextManager[None] = contextlib.nullcontext()
        if self._store is not None and self._rendezvous is not None:
            prefix = self._rendezvous.channel_prefix(generation)
            ordered = self._store.rank_zero_first(prefix, self.config.loader.alignment_timeout_s)
        with ordered:
            return Pipeline(
                self.dataset,
                self.config,
                self.collate_fn,
                rank=self.rank,
                rendezvous=self._rendezvous,
                generation=generation,
                max_seq_len=self._limits,
                pad_id=self.pad_id,
                data=self._data_handshake(),
                stream=self.stream,
            )

    def _iterate_with_processes(self) -> Generator[ODBBatch, None, None]:
        if self._pipeline is not None and self._epoch_active:
            self._close_pipeline(graceful=False)  # the last epoch was abandoned midway
        if self._pipeline is None:
            self._pipeline = self._start_pipeline(self._next_generation())
        pipeline, epoch = self._pipeline, self._epoch
        record, indices = self._begin_epoch(epoch)
        pipeline.start_epoch(epoch, indices)
        # A failure stops the processes at once: the peers then fail fast, not by timeout.
        stop = functools.partial(self._close_pipeline, graceful=False)
        yield from self._yield_epoch(record, pipeline.epoch_batches(), stop)
        if not self.config.loader.persistent_workers:
            self._close_pipeline(graceful=True)

    def _iterate_in_process(self) -> Generator[ODBBatch, None, None]:
        if self._epoch_active:
            self._close_channel()  # the last epoch was abandoned midway
        if self._channel is None:
            self._channel = open_channel(
                self.config, self._rendezvous, self._next_generation(), self._data_handshake()
            )
        source: SampleSource = InlineSource(self.dataset, self.config, self._limits)
        if self.stream is not None:
            source = StreamSource(source, self.stream, self.rank)
        runner = EpochRunner(
            self.config,
            rank=self.rank,
            channel=self._channel,
            source=source,
            slots=InlineSlots(),
            collate_fn=self.collate_fn,
            pad_id=self.pad_id,
        )
        record, indices = self._begin_epoch(self._epoch)
        yield from self._yield_epoch(record, runner.run(self._epoch, indices), self._close_channel)

    def _yield_epoch(
        self,
        record: EpochRecord,
        batches: Generator[ODBBatch, None, EpochStats],
        on_failure: Callable[[], None],
    ) -> Generator[ODBBatch, None, None]:
        """Yield the epoch's ``batches``, recording their ids for resume and the time spent
        waiting for them; on a failure call ``on_failure`` and re-raise."""
        self._epoch_active = True
        waited_s = 0.0
        try:
            while True:
                started = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration as end:
                    stats = end.value
                    break
                finally:
                    waited_s += time.perf_counter() - started
                record.yielded.append(batch.meta.sample_ids)
                yield self._pinned(batch)
        except Exception:
            on_failure()
            self._epoch_active = False
            raise
        self._epoch_active = False
        record.finished = True
        self.last_epoch_stats = replace(stats, loader_wait_s=waited_s)
