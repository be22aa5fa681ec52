"""``BatchedDataModule``: a dataset's loaders on this rank, batched by the configured mode,
and the exact mid-epoch resume of its training loader. The data modules of each kind of
source (:mod:`odb_lightning.lit.data.datamodule`, :mod:`odb_lightning.lit.data.vlm_datamodule`)
read their records into it at ``setup``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import numpy as np
from torch.utils.data import Dataset, Subset
from typing_extensions import override

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import ImageExtent
from odb_lightning.data.stream import ChatStream
from odb_lightning.lit.data.evaluation_split import split_indices, without_augmentation
from odb_lightning.lit.data.loaders import JobChannel, LightningLoader
from odb_lightning.lit.data.planned_mode import in_order_plan
from odb_lightning.lit.data.rank_loaders import RankLoaders
from odb_lightning.lit.data.resume_state import (
    batching_settings,
    pack_state,
    resume_changes,
    unpack_state,
)
from odb_lightning.lit.run_context import RunContext
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlannedLoader


class BatchedDataModule(pl.LightningDataModule):
    """One loader per rank over a dataset, with explicit per-rank sharding.

    Checkpoints resume mid-epoch exactly (``docs/design.md``, "The resume protocol"): the
    batches a step has taken are counted in :meth:`on_before_batch_transfer`, so a
    LightningModule that overrides that hook defers to this one. A subclass reads its
    records at ``setup`` into :attr:`dataset`, :attr:`train_indices` and :attr:`val_set`
    (and, where a length pass ran, :attr:`train_lengths` and :attr:`loss_tokens`), and
    says what names them (:meth:`data_identity`).

    Args:
        batching: The batching mode and every loader knob (``batching`` config group).
        pad_id: The tokenizer's padding id.
        max_seq_len: Samples are right-truncated to this many tokens (``data.sizes``).
        run: The run's context (from the app); ``None``: a context of its own.
    """

    def __init__(
        self, batching: BatchingConfig, pad_id: int, max_seq_len: int, run: RunContext | None
    ) -> None:
        super().__init__()
        self.batching, self.pad_id, self.max_seq_len = batching, pad_id, max_seq_len
        self.run = run if run is not None else RunContext()
        self.stream: ChatStream | None = None
        self.dataset: Dataset | None = None
        self.train_indices: list[int] = []
        self.train_lengths: list[int] = []
        self.loss_tokens: np.ndarray | None = None  # by dataset index, from the length pass
        self.val_set: Subset | None = None
        self.num_val_samples = 0  # val_samples as a count (known after setup)
        self._loaders: list[LightningLoader] = []
        self._train_loader: LightningLoader | None = None
        self._resume_state: dict[str, Any] | None = None  # a loaded train-loader state
        self.resume_changed_settings: dict[str, Any] = {}  # set by load_state_dict
        self._channel = JobChannel()

    def data_identity(self) -> dict[str, Any]:
        """What makes a dataset index name the same record (known after ``setup``)."""
        raise NotImplementedError

    @property
    def num_train_samples(self) -> int | None:
        """Training samples per epoch (known after ``setup``)."""
        return len(self.train_indices) if self.dataset is not None else None

    def length_range(self) -> tuple[int, int] | None:
        """The shortest and longest training sample, where a length pass measured them
        (``sorted``, ``bucketed``, ``oracle``; after ``setup``); ``None`` otherwise."""
        lengths = self.train_lengths
        return (min(lengths), max(lengths)) if lengths else None

    def largest_image(self) -> ImageExtent | None:
        """The largest image a sample can carry (``None``: a text run)."""
        return None

    def apply_token_budget(self, token_budget: int) -> None:
        """Batch under ``token_budget`` from now on (``batching.token_budget=auto``, as the
        memory warm-up resolved it; before the first loader is built)."""
        self.batching = replace(self.batching, token_budget=token_budget)

    # -- loaders ------------------------------------------------------------------------
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer else (1, 0)

    def _rank_loaders(self) -> RankLoaders:
        world_size, rank = self._world()
        return RankLoaders(
            self.batching, self.pad_id, self.max_seq_len, self.run.vocab_size,
            world_size, rank,
        )  # fmt: skip

    def _build_train_loader(self) -> ODBLoader | PlannedLoader:
        loaders = self._rank_loaders()
        if self.batching.policy.online:
            return loaders.online(self.dataset, self.train_indices, self.stream, self._channel)
        return loaders.planned_train(
            self.dataset, self.train_indices, self.train_lengths, self.loss_tokens
        )

    def _keep(self, loader: ODBLoader | PlannedLoader) -> LightningLoader:
        wrapped = LightningLoader(loader)
        self._loaders.append(wrapped)
        return wrapped

    @override
    def train_dataloader(self) -> LightningLoader:
        if self._train_loader is None:
            loader = self._build_train_loader()
            if self._resume_state is not None:
                loader.load_state_dict(self._resume_state)
                self._resume_state = None
            self._train_loader = self._keep(loader)
        return self._train_loader

    @override
    def val_dataloader(self) -> LightningLoader | list:
        if not self.num_val_samples:
            return []  # Lightning runs no validation for an empty list
        plan = in_order_plan(len(self.val_set), self.batching.eval_batch_size)
        return self._keep(self._rank_loaders().planned(self.val_set, plan))

    def evaluation_loader(self, split: str) -> LightningLoader:
        """Fixed in-order batches of ``batching.eval_batch_size`` over a split (after
        ``setup``): ``val`` (the held-out records, as validation sees them), ``train``
        (the training records, unaugmented) or ``all``; closed in :meth:`teardown`."""
        if self.stream is not None:
            raise ValueError(
                f"evaluation_loader({split!r}): a stream (data.streaming=true) has no random "
                "access; evaluate on the file with data.streaming=false"
            )
        held_out = self.val_set.indices if self.val_set is not None else []
        indices = split_indices(split, held_out, self.train_indices, len(self.dataset or ()))
        subset = Subset(without_augmentation(self.dataset), indices)
        plan = in_order_plan(len(subset), self.batching.eval_batch_size)
        return self._keep(self._rank_loaders().planned(subset, plan))

    @override
    def teardown(self, stage: str) -> None:
        loaders, self._loaders, self._train_loader = self._loaders, [], None
        self._channel.close()
        # Together: each close waits (bounded) for its children to exit; a stop must not
        # wait for the loaders one after another.
        with ThreadPoolExecutor(max_workers=max(1, len(loaders))) as pool:
            for closed in [pool.submit(loader.close) for loader in loaders]:
                closed.result()

    # -- checkpoints --------------------------------------------------------------------
    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        train = self._train_loader
        if train is not None and self.trainer is not None and self.trainer.training:
            train.take(self.trainer.global_step)
        return batch

    @override
    def state_dict(self) -> dict[str, Any]:
        """The training epoch and the samples consumed in it over all ranks.

        A collective under DDP (the ODB loader gathers every rank's consumed ids): Lightning
        calls it on every rank when it saves a checkpoint.
        """
        train = self._train_loader
        if train is None or self.trainer is None:
            return {}
        consumed = train.consumed_steps(self.trainer.global_step)
        loader_state = train.loader.state_dict(consumed_steps=consumed)
        settings = batching_settings(self.batching)
        return pack_state(self.data_identity(), self._world()[0], loader_state, settings)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training epoch of ``state_dict`` (called after ``setup``).

        Raises:
            ResumeStateError: The checkpoint was taken on other data, or is malformed.
        """
        if not state_dict:
            return
        self._resume_state = unpack_state(state_dict, self.data_identity(), self._world()[0])
        self.resume_changed_settings = resume_changes(state_dict, batching_settings(self.batching))
        if self._train_loader is not None:
            self._train_loader.loader.load_state_dict(self._resume_state)
            self._resume_state = None
