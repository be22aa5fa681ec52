"""The iterables the data module hands Lightning: a rank's shard of the training indices
(or the epoch's global order of them, dealt by need) for the ODB loader, the job's
metadata channel its loaders share, and a plain-iterable wrapper with the ``sampler``
handle through which Lightning sets the epoch."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from odb_lightning.core.order import epoch_permutation, shard_indices
from odb_lightning.runtime.batch import ODBBatch
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlannedLoader
from odb_lightning.runtime.rendezvous import JobRendezvous, MetadataStore, Rendezvous
from odb_lightning.runtime.stats import EpochStats

log = logging.getLogger(__name__)


class TrainShard:
    """``shard(epoch)`` for the ODB loader: this rank's share of the training indices.

    The loader then fetches ``dataset[i]`` by *dataset* index, so step metadata and the id
    audit name the source records, and a dataset with ``set_epoch`` (augmentation) is
    told the epoch in every worker.
    """

    def __init__(self, train_indices: list[int], world_size: int, rank: int, seed: int) -> None:
        self.train_indices, self.world_size, self.rank = train_indices, world_size, rank
        self.seed = seed

    def __call__(self, epoch: int) -> list[int]:
        positions = shard_indices(
            len(self.train_indices), self.world_size, self.rank, self.seed, epoch
        )
        return [self.train_indices[p] for p in positions]


class TrainOrder:
    """``order(epoch)`` for the ODB loader dealt by need (``shard_dealing=by_need``): the
    epoch's seeded order of the training indices, the same on every rank."""

    def __init__(self, train_indices: list[int], seed: int) -> None:
        self.train_indices, self.seed = train_indices, seed

    def __call__(self, epoch: int) -> list[int]:
        positions = epoch_permutation(len(self.train_indices), self.seed, epoch)
        return [self.train_indices[p] for p in positions]


class JobChannel:
    """The metadata channel of a data module's ODB loaders on the job's store.

    Connected once per job, when the first ODB loader is built (a collective: every rank
    builds its loaders in the same order), under any data-parallel strategy.
    """

    def __init__(self) -> None:
        self._job: JobRendezvous | None = None

    def for_loader(
        self, name: str, world_size: int, rank: int, timeout_s: float
    ) -> tuple[Rendezvous | None, MetadataStore | None]:
        """The rendezvous of loader ``name`` and the store (none on a single rank)."""
        if world_size == 1:
            return None, None
        if self._job is None:
            self._job = JobRendezvous.connect(world_size, rank, timeout_s)
        return self._job.for_loader(name), self._job.store

    def close(self) -> None:
        """Forget the job's connection (the next fit connects again)."""
        self._job = None


class _EpochHandle:
    """Lightning sets the epoch through ``loader.sampler.set_epoch`` (as for any
    ``DataLoader``); this hands it to the :class:`LightningLoader`."""

    def __init__(self, loader: LightningLoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_trainer_epoch(epoch)


class LightningLoader:
    """A plain iterable over an ODB or planned loader, with the ``sampler`` handle
    through which Lightning sets the epoch.

    Data epochs follow each other one per trainer epoch that used its data. After a resume
    Lightning's epoch number may differ from the data's: a run stopped by ``max_steps``
    counts its cut-short epoch as done while the data still has the rest of it to emit,
    and a run resumed at an epoch's end may first close that epoch again without taking a
    batch. So the first epoch Lightning sets keeps the loader where it is (a fresh start,
    or the loaded state), and each later one moves to the next data epoch only if the last
    one took a batch or ran to its end.
    """

    def __init__(self, loader: ODBLoader | PlannedLoader) -> None:
        self.loader = loader
        self.sampler = _EpochHandle(self)
        # Lightning inspects ``batch_sampler`` beside ``sampler`` (shuffle checks).
        self.batch_sampler = None
        self.epoch_stats: list[EpochStats] = []
        self._taken_steps = 0  # batches of this epoch the trainer took into a step
        self._stepped_steps = 0  # of those, the ones an optimizer step has applied
        self._global_step = 0  # the trainer's optimizer steps when last looked at
        self._finished = False  # the last iteration ran to the end of its epoch
        self._trainer_epoch: int | None = None

    def __iter__(self) -> Iterator[ODBBatch]:
        self._taken_steps = self._stepped_steps = 0
        self._finished = False
        yield from self.loader
        self._finished = True
        stats = getattr(self.loader, "last_epoch_stats", None)
        if stats is not None:
            self.epoch_stats.append(stats)

    def set_trainer_epoch(self, epoch: int) -> None:
        """Lightning starts its epoch ``epoch``: choose the data epoch (see the class)."""
        if self._trainer_epoch is not None and epoch != self._trainer_epoch:
            if self._taken_steps or self._finished:
                self.loader.set_epoch(self.loader.epoch + 1)
            else:
                log.info(
                    "trainer epoch %d runs data epoch %d again: none of it was taken",
                    epoch,
                    self.loader.epoch,
                )
        self._trainer_epoch = epoch

    def take(self, global_step: int) -> None:
        """The trainer takes the next batch into a step, after ``global_step`` optimizer
        steps."""
        self._note_optimizer_steps(global_step)
        self._taken_steps += 1

    def consumed_steps(self, global_step: int) -> int:
        """Batches of this epoch that a checkpoint taken now may count as consumed: those
        an optimizer step has applied. Lightning fetches a batch ahead of the one it
        trains, and a checkpoint may fall inside a gradient accumulation; neither counts.
        """
        self._note_optimizer_steps(global_step)
        return self._stepped_steps

    def _note_optimizer_steps(self, global_step: int) -> None:
        if self._taken_steps == 0:
            self._global_step = global_step
        elif global_step != self._global_step:  # every batch taken so far has been applied
            self._global_step, self._stepped_steps = global_step, self._taken_steps

    def close(self) -> None:
        self.loader.close()
