"""``ODBDataModule``: a chat source, the tokenizer and a batching mode, as one Lightning
data module that builds one loader per rank with explicit per-rank sharding."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import statistics
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import Dataset, Subset
from typing_extensions import override

from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.plan import BatchingMode
from odb_lightning.data import (
    Augmentation,
    ChatDataset,
    ChatTokenizer,
    LengthCache,
    SyntheticDataset,
    length_fingerprint,
    load_source,
)
from odb_lightning.data.length_cache import source_parts
from odb_lightning.lit.batching import BatchingConfig
from odb_lightning.lit.loaders import LightningLoader, TrainShard
from odb_lightning.lit.plans import LENGTH_PASS_MODES, epoch_plan, in_order_plan
from odb_lightning.lit.strategy import ODBStrategy
from odb_lightning.runtime.batch import pack_collate
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlanFn, PlannedLoader
from odb_lightning.runtime.rendezvous import Rendezvous
from odb_lightning.runtime.resume import ResumeStateError
from odb_lightning.runtime.stats import EpochStats

log = logging.getLogger(__name__)

ONLINE_MODES = (BatchingMode.ODB, BatchingMode.ODB_PACKED)
CHECKPOINT_FORMAT = 1
"""Version of the dictionary :meth:`ODBDataModule.state_dict` writes."""
IDENTITY_RECORDS = 64
"""Records whose ids (evenly spaced over the source) identify the data in a checkpoint."""


def _without_augmentation(dataset: Dataset) -> Dataset:
    """The same samples, never augmented: validation measures the unaugmented data."""
    if getattr(dataset, "augmentation", None) is None:
        return dataset
    plain = copy.copy(dataset)
    plain.augmentation = None
    return plain


class ODBDataModule(pl.LightningDataModule):
    """Chat data, tokenized in the loader workers, batched by the configured mode.

    Args:
        source: ``sharegpt``, ``chitchat``, ``ultrachat``, ``jsonl`` or ``synthetic``.
        tokenizer: The chat tokenizer (``tokenizer`` config group).
        batching: The batching mode and its knobs (``batching`` config group).
        path: ``ultrachat`` parquet file/dir or hub name; ``jsonl`` file.
        regime: ShareGPT ``whole``, ``first_exchange`` or ``mix``; for ``synthetic`` a
            length profile name (``sharegpt_whole``, ``sharegpt_first_exchange``,
            ``sharegpt_mix``).
        max_seq_len: Samples are right-truncated to this many tokens.
        max_samples: Cap on the records read from the source (train + validation).
        val_samples: Records held out for validation (a seeded choice); 0 = no validation.
        num_workers: Loader worker processes per rank (0 = in process, for debugging).
        seed: Seed of the split, the shard order and the step order.
        system_prompt: Default system prompt for conversations without one.
        augmentation: Seeded per-epoch augmentation (changes lengths between epochs;
            length-pass modes refuse it).
        length_cache_dir: Where length-pass modes keep their length caches.

    Checkpoints resume mid-epoch exactly: :meth:`state_dict` saves the training epoch and
    the samples consumed in it over all ranks (with an identity of the data), and a resumed
    run emits the rest of that epoch, each sample once. The batches a step has taken are
    counted in :meth:`on_before_batch_transfer` (so a LightningModule that overrides that
    hook defers to this one). The rest of an epoch is re-sharded when the number of ranks
    changed; a checkpoint of other data is refused.
    """

    def __init__(
        self,
        source: str,
        tokenizer: ChatTokenizer,
        batching: BatchingConfig,
        *,
        path: str | None = None,
        regime: str = "whole",
        max_seq_len: int = 4096,
        max_samples: int | None = None,
        val_samples: int = 64,
        num_workers: int = 2,
        seed: int = 0,
        system_prompt: str | None = None,
        augmentation: Augmentation | None = None,
        length_cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        if max_seq_len > batching.token_budget:
            raise ValueError(
                f"max_seq_len ({max_seq_len}) must not exceed token_budget "
                f"({batching.token_budget})"
            )
        if val_samples < 0:
            raise ValueError(f"val_samples must be >= 0, got {val_samples}")
        self.source, self.tokenizer, self.batching = source, tokenizer, batching
        self.path, self.regime, self.max_seq_len = path, regime, max_seq_len
        self.max_samples, self.val_samples = max_samples, val_samples
        self.num_workers, self.seed, self.system_prompt = num_workers, seed, system_prompt
        self.augmentation, self.length_cache_dir = augmentation, length_cache_dir
        self.dataset: Dataset | None = None
        self.train_indices: list[int] = []
        self.train_lengths: list[int] = []
        self.loss_tokens: list[int] | None = None  # by dataset index, from the length cache
        self.length_cache_s: float | None = None
        self.val_set: Subset | None = None
        self._loaders: list[LightningLoader] = []
        self._train_loader: LightningLoader | None = None
        self._resume_state: dict[str, Any] | None = None  # a loaded train-loader state
        self.source_counts: dict[str, int] = {}  # records read, kept, dropped (by reason)

    # -- data ---------------------------------------------------------------------------
    def _load_dataset(self) -> Dataset:
        if self.source == "synthetic":
            return SyntheticDataset.from_profile(
                self.regime, self.max_samples or 1024, max_seq_len=self.max_seq_len, seed=self.seed
            )
        records = load_source(
            self.source,
            path=self.path,
            regime=self.regime,
            max_samples=self.max_samples,
            seed=self.seed,
            on_bad_record=self.batching.on_bad_sample,
        )
        self.source_counts = dict(records.counts)
        return ChatDataset(
            records.records,
            self.tokenizer,
            self.max_seq_len,
            self.system_prompt,
            augmentation=self.augmentation,
        )

    def _exact_lengths(self, dataset: Dataset) -> tuple[list[int], list[int]]:
        """Lengths and loss tokens of every sample from the length cache (rank 0 builds
        it while the others wait, then they read it)."""
        if isinstance(dataset, SyntheticDataset):
            samples = [dataset[i] for i in range(len(dataset))]
            return [len(s["input_ids"]) for s in samples], [
                int((s["labels"][1:] != -100).sum()) for s in samples
            ]
        if self.length_cache_dir is None:
            raise ValueError(f"batching mode '{self.batching.mode}' needs data.length_cache_dir")
        parts = {
            **source_parts(
                self.source,
                path=self.path,
                regime=self.regime,
                max_samples=self.max_samples,
                seed=self.seed,
            ),
            **dataset.length_settings(),
        }
        cache = LengthCache(self.length_cache_dir)
        world_size, rank = self._world()
        if rank != 0:
            self.trainer.strategy.barrier("odb-length-cache")
        cached = cache.load_or_build(
            dataset,
            length_fingerprint(**parts),
            parts,
            num_workers=self.num_workers,
            multiprocessing_context=self.batching.multiprocessing_context,
        )
        if rank == 0 and world_size > 1:
            self.trainer.strategy.barrier("odb-length-cache")
        self.length_cache_s = cached.build_s
        return cached.lengths, cached.num_loss_tokens

    @override
    def setup(self, stage: str) -> None:
        if self.dataset is not None:
            return
        dataset = self._load_dataset()
        if self.val_samples and self.val_samples >= len(dataset):
            raise ValueError(
                f"val_samples ({self.val_samples}) leaves no training data: the source has "
                f"{len(dataset)} records"
            )
        order = epoch_permutation(len(dataset), self.seed, epoch=-1)
        self.dataset = dataset
        self.val_set = Subset(_without_augmentation(dataset), sorted(order[: self.val_samples]))
        self.train_indices = sorted(order[self.val_samples :])
        if self.batching.mode in LENGTH_PASS_MODES:
            lengths, loss_tokens = self._exact_lengths(dataset)
            self.train_lengths = [lengths[i] for i in self.train_indices]
            self.loss_tokens = loss_tokens

    @property
    def num_train_samples(self) -> int | None:
        """Training samples per epoch (known after ``setup``)."""
        return len(self.train_indices) if self.dataset is not None else None

    # -- loaders ------------------------------------------------------------------------
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer else (1, 0)

    def _rendezvous(self, name: str) -> Rendezvous | None:
        strategy = self.trainer.strategy if self.trainer else None
        return strategy.metadata_rendezvous(name) if isinstance(strategy, ODBStrategy) else None

    def _online_loader(self, name: str) -> ODBLoader:
        b = self.batching
        packed = b.mode is BatchingMode.ODB_PACKED
        # odb_packed emits each group as one padding-free row; odb keeps the default pad.
        pack = pack_collate if packed else None
        return ODBLoader(
            self.dataset,
            shard=TrainShard(self.train_indices, *self._world(), self.seed),
            token_budget=b.token_budget,
            outstanding_depth=b.outstanding_depth,
            num_workers=self.num_workers,
            collate_fn=pack,
            join=b.join,
            seed=self.seed,
            multiprocessing_context=b.multiprocessing_context,
            max_steps_per_round=b.max_steps_per_round,
            max_seq_len=self.max_seq_len,
            on_bad_sample=b.on_bad_sample,
            timeout_s=b.timeout_s,
            alignment_timeout_s=b.alignment_timeout_s,
            persistent_workers=b.persistent_workers,
            rendezvous=self._rendezvous(name),
            pad_id=self.tokenizer.pad_id,
            attention_weight=b.attention_weight,
            packed=packed,
        )

    def _planned_loader(
        self, dataset: Dataset, plan: PlanFn, loss_tokens: list[int] | None = None
    ) -> PlannedLoader:
        b = self.batching
        world_size, rank = self._world()
        return PlannedLoader(
            dataset,
            plan,
            world_size=world_size,
            rank=rank,
            num_workers=self.num_workers,
            pad_id=self.tokenizer.pad_id,
            max_seq_len=self.max_seq_len,
            multiprocessing_context=b.multiprocessing_context,
            persistent_workers=b.persistent_workers,
            timeout_s=b.timeout_s,
            loss_tokens=loss_tokens,
        )

    def _keep(self, loader: ODBLoader | PlannedLoader) -> LightningLoader:
        wrapped = LightningLoader(loader)
        self._loaders.append(wrapped)
        return wrapped

    @override
    def train_dataloader(self) -> LightningLoader:
        if self._train_loader is None:
            mode = self.batching.mode
            if mode in ONLINE_MODES:
                loader: ODBLoader | PlannedLoader = self._online_loader("train")
            else:
                positions = epoch_plan(
                    self.train_lengths, self.batching, self.seed, len(self.train_indices)
                )
                indices = self.train_indices

                def plan(epoch: int) -> list[list[int]]:
                    return [[indices[p] for p in batch] for batch in positions(epoch)]

                loader = self._planned_loader(self.dataset, plan, self.loss_tokens)
            if self._resume_state is not None:
                loader.load_state_dict(self._resume_state)
                self._resume_state = None
            self._train_loader = self._keep(loader)
        return self._train_loader

    @override
    def val_dataloader(self) -> LightningLoader | list:
        if not self.val_samples:
            return []  # Lightning runs no validation for an empty list
        plan = in_order_plan(len(self.val_set), self.batching.batch_size)
        return self._keep(self._planned_loader(self.val_set, plan))

    @override
    def teardown(self, stage: str) -> None:
        loaders, self._loaders, self._train_loader = self._loaders, [], None
        for loader in loaders:
            loader.close()

    # -- checkpoints --------------------------------------------------------------------
    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        train = self._train_loader
        if train is not None and self.trainer is not None and self.trainer.training:
            train.take(self.trainer.global_step)
        return batch

    def data_identity(self) -> dict[str, Any]:
        """What makes a dataset index name the same record: the source, the split, the
        record count and a digest of evenly spaced records (ids and content), known after
        ``setup``. The file path is left out: moved data still resumes."""
        records = getattr(self.dataset, "records", None) or []
        step = max(1, len(records) // IDENTITY_RECORDS)
        sampled = [records[i] for i in range(0, len(records), step)]
        digest = hashlib.sha256(json.dumps(sampled, sort_keys=True, default=str).encode())
        return {
            "source": self.source,
            "regime": self.regime,
            "max_samples": self.max_samples,
            "seed": self.seed,
            "val_samples": self.val_samples,
            "num_records": len(self.dataset) if self.dataset is not None else None,
            "train_samples": len(self.train_indices),
            "records": digest.hexdigest()[:16],
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        """The training epoch and the samples consumed in it over all ranks.

        A collective under DDP (the ODB loader gathers every rank's consumed ids): Lightning
        calls it on every rank when it saves a checkpoint.
        """
        train = self._train_loader
        if train is None or self.trainer is None:
            return {}
        return {
            "format": CHECKPOINT_FORMAT,
            "data": self.data_identity(),
            "world_size": self._world()[0],
            "train": train.loader.state_dict(
                consumed_steps=train.consumed_steps(self.trainer.global_step)
            ),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training epoch of ``state_dict`` (called after ``setup``).

        Raises:
            ResumeStateError: The checkpoint was taken on other data, or is malformed.
        """
        if not state_dict:
            return
        if state_dict.get("format") != CHECKPOINT_FORMAT:
            raise ResumeStateError(
                f"data module checkpoint state has format {state_dict.get('format')!r}, "
                f"this version reads {CHECKPOINT_FORMAT}"
            )
        saved, current = state_dict["data"], self.data_identity()
        changed = [k for k in sorted(current) if saved.get(k) != current[k]]
        if changed:
            what = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in changed)
            raise ResumeStateError(
                f"the checkpoint was taken on other training data ({what}); resume with the "
                "data of the checkpoint, or start a new run without ckpt_path"
            )
        world_size = self._world()[0]
        if state_dict["world_size"] != world_size:
            log.info(
                "checkpoint taken with %d ranks, resuming with %d: the rest of the epoch is "
                "re-sharded over the ranks there are now",
                state_dict["world_size"],
                world_size,
            )
        self._resume_state = state_dict["train"]
        if self._train_loader is not None:
            self._train_loader.loader.load_state_dict(self._resume_state)
            self._resume_state = None

    # -- reporting ----------------------------------------------------------------------
    def _train_epoch_stats(self) -> list[EpochStats]:
        return self._train_loader.epoch_stats if self._train_loader else []

    def run_facts(self) -> dict[str, Any]:
        """What the run was, and this rank's alignment round latency, for the summary."""
        latency_ms = sorted(1000 * t for s in self._train_epoch_stats() for t in s.round_latency_s)
        facts: dict[str, Any] = {
            "mode": self.batching.mode.value,
            "outstanding_depth": self.batching.outstanding_depth,
            "source": self.source,
            "regime": self.regime,
            "max_seq_len": self.max_seq_len,
            "train_samples": self.num_train_samples,
            "length_cache_s": self.length_cache_s,
            "source_records": self.source_counts,
        }
        if latency_ms:
            facts["alignment_round_ms_median"] = statistics.median(latency_ms)
            # Nearest-rank percentile.
            facts["alignment_round_ms_p99"] = latency_ms[math.ceil(0.99 * len(latency_ms)) - 1]
        return facts

    def skipped_sample_ids(self) -> list[int]:
        """Dataset indices this rank skipped as bad samples (``on_bad_sample=skip``)."""
        return sorted(i for s in self._train_epoch_stats() for i in s.skipped_ids)

    def loader_counters(self) -> dict[str, int]:
        """This rank's loader counters over every finished epoch (summed over ranks by
        the metrics callback). Always the same keys, so ranks can all-gather them."""
        stats = self._train_epoch_stats()
        return {
            "dropped_samples": sum(s.dropped for s in stats),
            "over_budget_samples": sum(s.over_budget for s in stats),
            "skipped_bad_samples": sum(len(s.skipped_ids) for s in stats),
            "alignment_rounds": sum(s.rounds for s in stats),
        }
