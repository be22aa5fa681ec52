"""A rank's loaders of one data module: the training loader of the batching mode (the ODB
loader, or a loader of planned batches) and the in-order loaders of evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.stream import ChatStream
from odb_lightning.lit.data.loaders import JobChannel, TrainOrder, TrainShard
from odb_lightning.lit.data.planned_mode import epoch_plan
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlanFn, PlannedLoader


@dataclass(frozen=True)
class RankLoaders:
    """Builds this rank's loaders with the run's batching config and sample limits."""

    batching: BatchingConfig
    pad_id: int
    max_seq_len: int
    vocab_size: int | None
    world_size: int
    rank: int

    def planned(
        self, dataset: Dataset, plan: PlanFn, loss_tokens: Sequence[int] | None = None
    ) -> PlannedLoader:
        """Batches of ``plan(epoch)``, dataset indices each (evaluation, planned modes)."""
        return PlannedLoader(
            dataset,
            plan,
            self.batching,
            world_size=self.world_size,
            rank=self.rank,
            pad_id=self.pad_id,
            max_seq_len=self.max_seq_len,
            vocab_size=self.vocab_size,
            loss_tokens=loss_tokens,
        )

    def online(
        self,
        dataset: Dataset,
        train_indices: list[int],
        stream: ChatStream | None,
        channel: JobChannel,
    ) -> ODBLoader:
        """The ODB loader over the training records: this rank's part of a stream, the
        epoch's global order (dealt by need) or this rank's fixed shard."""
        seed, timeout_s = self.batching.seed, self.batching.loader.alignment_timeout_s
        rendezvous, store = channel.for_loader("train", self.world_size, self.rank, timeout_s)
        if stream is not None:
            indices: dict[str, Any] = {"stream": stream}
        elif self.batching.policy.by_need:
            indices = {"order": TrainOrder(train_indices, seed)}
        else:
            indices = {"shard": TrainShard(train_indices, self.world_size, self.rank, seed)}
        return ODBLoader(
            dataset,
            self.batching,
            **indices,
            rendezvous=rendezvous,
            metadata_store=store,
            pad_id=self.pad_id,
            max_seq_len=self.max_seq_len,
            vocab_size=self.vocab_size,
        )

    def planned_train(
        self,
        dataset: Dataset,
        train_indices: list[int],
        train_lengths: list[int],
        loss_tokens: Sequence[int] | None,
    ) -> PlannedLoader:
        """The planned mode's epochs over the training records (their exact lengths)."""
        positions = epoch_plan(train_lengths, self.batching, len(train_indices))

        def plan(epoch: int) -> list[list[int]]:
            return [[train_indices[p] for p in batch] for batch in positions(epoch)]

        return self.planned(dataset, plan, loss_tokens)
