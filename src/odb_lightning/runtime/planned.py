"""Loader for modes whose epoch plan is made up front (``standard``, ``sorted``,
``bucketed``, ``oracle``): the whole job's batch list comes from
:func:`~odb_lightning.core.planners.plan_epoch`, is dealt to ranks round-robin, and a plain
``torch.utils.data.DataLoader`` runs this rank's share.

Ranks that get fewer batches are topped up with IDLE batches, so every rank yields the
same number of steps, as with :class:`~odb_lightning.runtime.loader.ODBLoader`, and no
sample is duplicated (``DistributedSampler`` pads by repeating samples instead).

Resume (:mod:`~odb_lightning.runtime.resume`): a resumed epoch runs its plan without the
consumed samples, dealt to the ranks there are now, so an unchanged plan goes on with the
next batch of the uninterrupted run. Every rank knows the plan: saving needs no collective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from torch.utils.data import DataLoader, Dataset

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import RowLayout
from odb_lightning.core.signals import reset_inherited_handlers, signals_held
from odb_lightning.runtime.batch import (
    CollateFn,
    ODBBatch,
    build_step_meta,
    collate_of,
    idle_samples,
    pin_batch,
    pins_memory,
)
from odb_lightning.runtime.pipeline import start_method
from odb_lightning.runtime.resume import EpochRecord, EpochResume
from odb_lightning.sample import SampleLimits, normalize_sample

PlanFn = Callable[[int], list[list[int]]]
"""``plan(epoch)``: the whole job's batches for an epoch, dataset indices."""


def deal_batches(batches: list[list[int]], world_size: int, rank: int) -> list[list[int]]:
    """Rank ``rank``'s batches: every ``world_size``-th, topped up with IDLE (``[]``)."""
    steps = -(-len(batches) // world_size)
    mine = batches[rank::world_size]
    return mine + [[] for _ in range(steps - len(mine))]


class StepTotals(NamedTuple):
    """Global counts of one step position, from the plan (loss tokens if known)."""

    samples: int
    loss_tokens: int | None


class _IndexedDataset(Dataset):
    """``dataset[i]`` together with ``i``, so the collate can name bad samples. Keys are
    ``(epoch, i)``: a dataset with ``set_epoch`` (per-epoch augmentation) learns the epoch
    in each worker's copy before the fetch."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, Any]:
        epoch, index = key
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch) and getattr(self.dataset, "epoch", None) != epoch:
            set_epoch(epoch)
        return index, self.dataset[index]


class _EpochBatches:
    """Batch sampler over this rank's share of the current epoch's plan."""

    def __init__(
        self, plan: PlanFn, world_size: int, rank: int, loss_tokens: Sequence[int] | None
    ) -> None:
        self.plan, self.world_size, self.rank = plan, world_size, rank
        self.loss_tokens = loss_tokens
        self.epoch = 0
        self._left_out: frozenset[int] = frozenset()
        self._epoch: tuple[int, list[list[list[int]]], list[StepTotals]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def leave_out(self, consumed: frozenset[int]) -> None:
        """Ids the current epoch's plan leaves out (consumed before a resume)."""
        if consumed != self._left_out:
            self._left_out, self._epoch = consumed, None

    def shares(self) -> list[list[list[int]]]:
        """Every rank's batches of the current epoch, by rank."""
        return self._current()[1]

    def current(self) -> tuple[list[list[int]], list[StepTotals]]:
        """This rank's batches and the global totals of every step position."""
        _, shares, totals = self._current()
        return shares[self.rank], totals

    def _current(self) -> tuple[int, list[list[list[int]]], list[StepTotals]]:
        if self._epoch is None or self._epoch[0] != self.epoch:
            everything = self.plan(self.epoch)
            if self._left_out:
                everything = [kept for b in everything if (kept := self._without_left_out(b))]
            shares = [deal_batches(everything, self.world_size, r) for r in range(self.world_size)]
            totals = [
                self._totals([share[step] for share in shares]) for step in range(len(shares[0]))
            ]
            self._epoch = (self.epoch, shares, totals)
        return self._epoch

    def _without_left_out(self, batch: list[int]) -> list[int]:
        return [i for i in batch if i not in self._left_out]

    def _totals(self, column: list[list[int]]) -> StepTotals:
        samples = sum(len(batch) for batch in column)
        if self.loss_tokens is None:
            return StepTotals(samples, None)
        loss_tokens = sum(int(self.loss_tokens[i]) for batch in column for i in batch)
        return StepTotals(samples, loss_tokens)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for batch in self.current()[0]:
            yield [(self.epoch, index) for index in batch]

    def __len__(self) -> int:
        return len(self.current()[0])


class _PlannedCollate:
    """Validates and collates one planned batch into an :class:`ODBBatch`."""

    def __init__(
        self,
        batches: _EpochBatches,
        collate_fn: CollateFn,
        pad_id: int,
        limits: SampleLimits,
        rows: RowLayout,
    ) -> None:
        self.batches, self.collate_fn, self.pad_id = batches, collate_fn, pad_id
        self.limits, self.rows = limits, rows

    def __call__(self, items: Sequence[tuple[int, Mapping[str, Any]]]) -> ODBBatch:
        ids = tuple(index for index, _ in items)
        checked = [normalize_sample(sample, index, self.limits) for index, sample in items]
        counts = [stats for _, stats in checked]
        samples = [sample for sample, _ in checked] or idle_samples(self.pad_id)
        meta = build_step_meta(
            ids,
            [length for length, _ in counts],
            sum(loss for _, loss in counts),
            rows=self.rows,
            global_samples=0,  # the global counts and the step: PlannedLoader.__iter__
            global_loss_tokens=None,
            round_index=0,
            step=0,
            epoch=self.batches.epoch,
        )
        return ODBBatch(inputs=self.collate_fn(samples), meta=meta)


class PlannedLoader:
    """Runs a precomputed epoch plan with a ``DataLoader``; yields :class:`ODBBatch`.

    Args:
        dataset: Map-style dataset of ``{"input_ids", "labels"}`` samples.
        plan: ``plan(epoch)``: the whole job's batches for that epoch.
        config: The batching settings: the loader's processes (``config.loader``) and
            the row layout (its collate and padded-token count).
        world_size: Ranks sharing the plan.
        rank: This rank.
        collate_fn: Model inputs from a list of samples (default: the row layout's).
        pad_id: Padding id (default collate and IDLE batches).
        max_seq_len: Longer samples are bad samples.
        vocab_size: Samples with a token id (or supervised label) at or above it are bad
            samples (``None``: not checked).
        loss_tokens: Supervised tokens of every sample, when a length pass knows them:
            then each step's global count is in its metadata (no collective needed).
        **knobs: Settings by their field names that replace those of ``config``
            (:meth:`~odb_lightning.core.config.BatchingConfig.of`).
    """

    def __init__(
        self,
        dataset: Any,
        plan: PlanFn,
        config: BatchingConfig | None = None,
        *,
        world_size: int = 1,
        rank: int = 0,
        collate_fn: CollateFn | None = None,
        pad_id: int = 0,
        max_seq_len: int | None = None,
        vocab_size: int | None = None,
        loss_tokens: Sequence[int] | None = None,
        **knobs: Any,
    ) -> None:
        config = BatchingConfig.of(config, **knobs)
        self.config = config
        self.batches = _EpochBatches(plan, world_size, rank, loss_tokens)
        self._num_samples = len(dataset)
        self._resume = EpochResume()
        self._shares: list[list[list[int]]] = []  # every rank's batches of the recorded epoch
        collate = _PlannedCollate(
            self.batches,
            collate_fn or collate_of(config.rows, pad_id),
            pad_id,
            SampleLimits(max_seq_len, vocab_size),
            config.rows,
        )
        self._pin = pins_memory(config)
        workers = config.loader.num_workers
        method = start_method(config)
        self._loader = DataLoader(
            _IndexedDataset(dataset),
            batch_sampler=self.batches,
            collate_fn=collate,
            num_workers=workers,
            multiprocessing_context=method if workers else None,
            persistent_workers=config.loader.persistent_workers and workers > 0,
            timeout=config.loader.timeout_s if workers else 0,
            worker_init_fn=reset_inherited_handlers,
        )

    def set_epoch(self, epoch: int) -> None:
        """Epoch of the next iteration; equal on every rank."""
        self.batches.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (set by :meth:`set_epoch` or a loaded state)."""
        return self.batches.epoch

    def state_dict(self, consumed_steps: int | None = None) -> dict[str, Any]:
        """As :meth:`ODBLoader.state_dict <odb_lightning.runtime.loader.ODBLoader.state_dict>`,
        without a collective."""
        return self._resume.state(self.batches.epoch, consumed_steps, self._everywhere)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration run the rest of the epoch ``state`` describes."""
        self.batches.set_epoch(self._resume.load(state, self._num_samples).epoch)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[ODBBatch]:
        record = self._resume.begin(self.batches.epoch)
        self.batches.leave_out(record.start.consumed)
        self._shares = self.batches.shares()
        _, totals = self.batches.current()
        with signals_held():  # starts the workers; each resets its inherited handlers first
            batches = iter(self._loader)
        for step, batch in enumerate(batches):
            meta = batch.meta._replace(
                step=step,
                global_samples=totals[step].samples,
                global_loss_tokens=totals[step].loss_tokens,
            )
            record.yielded.append(meta.sample_ids)
            inputs = pin_batch(batch.inputs) if self._pin else batch.inputs
            yield batch._replace(inputs=inputs, meta=meta)
        record.finished = True

    def _everywhere(self, record: EpochRecord, steps: int) -> tuple[list[int], bool]:
        """Ids of the first ``steps`` batches of every rank's share of the recorded epoch."""
        consumed = [i for share in self._shares for batch in share[:steps] for i in batch]
        return consumed, record.ended_with(steps)

    def close(self) -> None:
        """Stop persistent workers (the DataLoader owns and joins them)."""
        self._loader = None  # type: ignore[assignment]
