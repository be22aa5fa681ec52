"""The iterables the data module hands Lightning: a rank's shard of the training indices
for the ODB loader, and a plain-iterable wrapper with the ``sampler`` handle through which
Lightning sets the epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from odb_lightning.core.order import shard_indices
from odb_lightning.runtime.batch import ODBBatch
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlannedLoader
from odb_lightning.runtime.stats import EpochStats


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


class _EpochHandle:
    """Lightning sets the epoch through ``loader.sampler.set_epoch`` (as for any
    ``DataLoader``); this forwards it to a loader that is a plain iterable."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class LightningLoader:
    """A plain iterable over an ODB or planned loader, with the ``sampler`` handle
    through which Lightning sets the epoch."""

    def __init__(self, loader: ODBLoader | PlannedLoader) -> None:
        self.loader = loader
        self.sampler = _EpochHandle(loader)
        # Lightning inspects ``batch_sampler`` beside ``sampler`` (shuffle checks).
        self.batch_sampler = None
        self.epoch_stats: list[EpochStats] = []
        # Batches of the current epoch the trainer has taken into a step. Lightning fetches
        # one batch ahead, so this is what a checkpoint may count as consumed.
        self.taken_steps = 0

    def __iter__(self) -> Iterator[ODBBatch]:
        self.taken_steps = 0
        yield from self.loader
        stats = getattr(self.loader, "last_epoch_stats", None)
        if stats is not None:
            self.epoch_stats.append(stats)

    def close(self) -> None:
        self.loader.close()
