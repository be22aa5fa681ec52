"""``ODBDataModule``: a chat source, the tokenizer and a batching mode, as one Lightning
data module that builds one loader per rank with explicit per-rank sharding."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch.utils.data import Dataset, Subset
from typing_extensions import override

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import ImageExtent
from odb_lightning.data import Augmentation, ChatDataset, ChatTokenizer, SyntheticDataset
from odb_lightning.data.record_table import RecordCache, default_record_cache_dir
from odb_lightning.data.sizes import check_size, records_to_read
from odb_lightning.data.stream import ChatStream, StreamedChatDataset, convert_jsonl_stream
from odb_lightning.data.template import resolve_template_name
from odb_lightning.lit.callbacks.run_report import RunReport
from odb_lightning.lit.data.chat_source import ChatSource
from odb_lightning.lit.data.evaluation_split import hold_out, split_indices, without_augmentation
from odb_lightning.lit.data.loaders import JobChannel, LightningLoader, TrainOrder, TrainShard
from odb_lightning.lit.data.planned_mode import epoch_plan, in_order_plan
from odb_lightning.lit.data.resume_state import (
    batching_settings,
    data_identity,
    pack_state,
    resume_changes,
    unpack_state,
)
from odb_lightning.lit.data.skipped_records import (
    rejected_entries,
    report_skipped_records,
    unsupervised_entries,
)
from odb_lightning.lit.data.streaming import check_streaming
from odb_lightning.lit.data.train_records import (
    count_train_records,
    no_records_error,
    no_supervision_error,
)
from odb_lightning.lit.run_context import RunContext
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlanFn, PlannedLoader

log = logging.getLogger(__name__)


class ODBDataModule(pl.LightningDataModule):
    """Chat data, tokenized in the loader workers, batched by the configured mode.

    Checkpoints resume mid-epoch exactly (``docs/design.md``, "The resume protocol"): the
    batches a step has taken are counted in :meth:`on_before_batch_transfer`, so a
    LightningModule that overrides that hook defers to this one.

    Args:
        source: ``sharegpt``, ``chitchat``, ``ultrachat``, ``jsonl`` or ``synthetic``.
        tokenizer: The chat tokenizer (``tokenizer`` config group).
        batching: The batching mode and every loader knob (``batching`` config group);
            its ``seed`` also draws the validation split.
        path: ``ultrachat`` parquet file/dir or hub name; ``jsonl`` file.
        regime: ShareGPT ``whole``, ``first_exchange`` or ``mix``; for ``synthetic`` a
            length profile (``sharegpt_whole``, ``_first_exchange``, ``_mix``).
        max_seq_len: Samples are right-truncated to this many tokens.
        max_samples: Records read from the source (train + validation): a count, a
            fraction in (0, 1) of the source's records, or ``None`` for all of them.
        val_samples: Records held out for validation (a seeded choice): a count, a
            fraction in (0, 1) of the records read, or 0/``None`` for no validation
            (:mod:`odb_lightning.data.sizes`).
        system_prompt: Default system prompt for conversations without one.
        template: The chat template: ``auto`` (the tokenizer's own where its ``{%
            generation %}`` blocks mark assistant tokens, else the layout it shows),
            ``chatml``, ``qwen3``, ``llama3``, ``mistral``, ``gemma`` or ``hf``; chosen
            and checked against the tokenizer here, at construction.
        augmentation: Seeded per-epoch augmentation (changes lengths between epochs;
            length-pass modes refuse it).
        length_cache_dir: Where length-pass modes keep their length caches.
        record_cache_dir: Where every source but ``ultrachat`` and ``synthetic`` is
            converted once into a memory-mapped record table and read from
            (:mod:`odb_lightning.data.record_table`); ``None``: a directory
            ``odb_lightning/records`` in the ``datasets`` cache (``HF_DATASETS_CACHE``).
        streaming: Stream the records (``jsonl``): the file is written once as LitData
            chunks under ``stream_cache_dir`` and each rank reads its own part in order,
            never the whole set (:mod:`odb_lightning.data.stream`). Online modes with
            ``batching.policy.shard_dealing=fixed`` only, without a validation hold-out.
        stream_cache_dir: Where streamed files are written as chunks, keyed by a
            fingerprint of the file.
        run: The run's context (from the app): the vocabulary the loaders check token ids
            against, the training sample count this module fills at ``setup``, and the run
            directory, where ``skipped_records.jsonl`` names the records read but not
            trained on (:mod:`odb_lightning.lit.data.skipped_records`). ``None``: no vocabulary
            check, a count of its own, and no file.
        max_samples_from: What set ``max_samples``, named (with how to read every record)
            in the warning that a file was read only in part: ``debug=smoke`` when the app
            knows that preset set it; ``None``: ``data.max_samples`` itself.
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
        max_samples: int | float | None = None,
        val_samples: int | float | None = 64,
        system_prompt: str | None = None,
        template: str = "auto",
        augmentation: Augmentation | None = None,
        length_cache_dir: str | None = None,
        record_cache_dir: str | None = None,
        streaming: bool = False,
        stream_cache_dir: str | None = None,
        run: RunContext | None = None,
        max_samples_from: str | None = None,
    ) -> None:
        super().__init__()
        if run is not None and run.max_seq_len != max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len} is not the run's {run.max_seq_len}")
        self.run = run if run is not None else RunContext(max_seq_len=max_seq_len)
        if source != "synthetic":  # a wrong template fails now, naming data.template
            template = resolve_template_name(tokenizer, template).value
        self.template = template
        check_size("max_samples", max_samples, least=1)
        check_size("val_samples", val_samples, least=0)
        self.source, self.tokenizer, self.batching = source, tokenizer, batching
        self.path, self.regime, self.max_seq_len = path, regime, max_seq_len
        self.max_samples, self.val_samples = max_samples, val_samples
        self.max_samples_from = max_samples_from
        self.system_prompt = system_prompt
        self.augmentation, self.length_cache_dir = augmentation, length_cache_dir
        self.record_cache = RecordCache(record_cache_dir or default_record_cache_dir())
        self.streaming, self.stream_cache_dir = streaming, stream_cache_dir
        if streaming:
            check_streaming(source, batching, max_samples, val_samples, stream_cache_dir)
        self.stream: ChatStream | None = None
        self.dataset: Dataset | None = None
        self.train_indices: list[int] = []
        self.train_lengths: list[int] = []
        self.loss_tokens: np.ndarray | None = None  # by dataset index, from the length pass
        self.length_cache_s: float | None = None
        self.val_set: Subset | None = None
        self.num_val_samples = 0  # val_samples as a count (known after setup)
        self._loaders: list[LightningLoader] = []
        self._train_loader: LightningLoader | None = None
        self._resume_state: dict[str, Any] | None = None  # a loaded train-loader state
        self._channel = JobChannel()
        self.source_counts: dict[str, int] = {}  # records read, kept, dropped (by reason)
        self.source_rejected: list[str] = []  # the source's message of each line it skipped
        # Training records without supervised tokens / truncated (see setup).
        self.train_record_counts: dict[str, int] = {}

    # -- data ---------------------------------------------------------------------------
    def _chat_source(self) -> ChatSource:
        return ChatSource(self.source, self.path, self.regime, self.max_samples, self.batching.seed)

    def _load_dataset(self) -> Dataset:
        if self.source == "synthetic":
            return SyntheticDataset.from_profile(
                self.regime,
                records_to_read(self.max_samples) or 1024,
                max_seq_len=self.max_seq_len,
                seed=self.batching.seed,
            )
        kept, self.source_counts, self.source_rejected = self._chat_source().read(
            self.batching.loader.on_bad_sample.value, self.record_cache
        )
        self._note_partial_read(len(kept))
        return ChatDataset(
            kept,
            self.tokenizer,
            self.max_seq_len,
            self.system_prompt,
            augmentation=self.augmentation,
            template=self.template,
        )

    def _open_stream(self) -> None:
        """The stream of the file (written once as chunks) and its tokenizing dataset."""
        on_bad_record = self.batching.loader.on_bad_sample.value
        directory = convert_jsonl_stream(self.path, self.stream_cache_dir, on_bad_record)
        self.stream = ChatStream(directory)
        self.source_counts = dict(self.stream.counts)
        if self.stream.num_records == 0:
            raise no_records_error(self.source, self.path, self.source_counts, on_bad_record)
        self.dataset = StreamedChatDataset(
            self.stream.num_records,
            self.tokenizer,
            self.max_seq_len,
            system_prompt=self.system_prompt,
            augmentation=self.augmentation,
            template=self.template,
        )
        self.train_indices = range(self.stream.num_records)  # type: ignore[assignment]
        self.run.train_samples.set(self.stream.num_records)

    def _note_partial_read(self, num_kept: int) -> None:
        """Warn (rank 0) that a file was read only up to ``max_samples`` records, so its
        other records are neither trained on nor checked, naming how to read them all."""
        limit = records_to_read(self.max_samples)
        if self.path is None or limit is None or num_kept < limit:
            return
        if rank_zero_only.rank != 0:
            return
        if self.max_samples_from is None:
            origin = f"data.max_samples={limit}"
            fix = "data.max_samples=null reads every record"
        else:
            origin = self.max_samples_from
            fix = f"drop {origin} to read every record"
        # Known without reading the file where a run read it whole before.
        whole = self._chat_source().whole_count(
            self.batching.loader.on_bad_sample.value, self.record_cache
        )
        of = f" of {whole:,}" if whole is not None else ""
        log.warning(
            "%s: read the first %d%s records of %s; the rest is not checked (%s)",
            origin, limit, of, self.path, fix,
        )  # fmt: skip

    def _report_skipped(self, unsupervised: list[int]) -> None:
        """Name every source line skipped and every training record without a supervised
        token in the run directory's ``skipped_records.jsonl`` (rank 0), and log the
        counts with its path."""
        entries = rejected_entries(self.source, self.source_rejected)
        record_ids = self.record_ids(unsupervised)
        exact = self.loss_tokens is not None
        entries += unsupervised_entries(self.source, record_ids, exact=exact)
        counts = {
            "source lines skipped as bad records": self.source_counts.get("dropped/bad_record", 0),
            "training records without a supervised token": len(unsupervised),
        }
        report_skipped_records(entries, counts, self.run.output_dir)

    @override
    def setup(self, stage: str) -> None:
        if self.dataset is not None:
            return
        if self.streaming:
            # Unsupervised and truncated records are counted by the loader as they pass.
            self._open_stream()
            return
        dataset = self._load_dataset()
        if len(dataset) == 0:
            raise no_records_error(
                self.source, self.path, self.source_counts, self.batching.loader.on_bad_sample.value
            )
        val_indices, self.train_indices = hold_out(
            len(dataset), self.val_samples, self.batching.seed
        )
        self.num_val_samples = len(val_indices)
        self.dataset = dataset
        self.val_set = Subset(without_augmentation(dataset), val_indices)
        if self.batching.policy.needs_length_pass:
            source, barrier = self._chat_source(), self._length_cache_barrier
            exact = source.exact_lengths(
                dataset, self.length_cache_dir, self.batching, *self._world(), barrier
            )
            train = np.asarray(self.train_indices, dtype=np.int64)
            self.train_lengths = exact.lengths[train].tolist()
            self.loss_tokens, self.length_cache_s = exact.num_loss_tokens, exact.build_s
        self.run.train_samples.set(len(self.train_indices))
        self.train_record_counts, unsupervised = count_train_records(
            dataset, self.train_indices, self.train_lengths, self.loss_tokens, self.max_seq_len
        )
        self._report_skipped(unsupervised)
        if self.train_indices and len(unsupervised) == len(self.train_indices):
            read = self.source_counts.get("read", len(dataset))
            raise no_supervision_error(
                self.source,
                self.path,
                read,
                len(self.train_indices),
                self.max_seq_len,
                exact=self.loss_tokens is not None,
            )

    def _length_cache_barrier(self) -> None:
        if self.trainer is not None:  # without one (odb-preview) this is the only process
            self.trainer.strategy.barrier("odb-length-cache")

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

    def _planned_loader(
        self, dataset: Dataset, plan: PlanFn, loss_tokens: Sequence[int] | None = None
    ) -> PlannedLoader:
        world_size, rank = self._world()
        return PlannedLoader(
            dataset,
            plan,
            self.batching,
            world_size=world_size,
            rank=rank,
            pad_id=self.tokenizer.pad_id,
            max_seq_len=self.max_seq_len,
            vocab_size=self.run.vocab_size,
            loss_tokens=loss_tokens,
        )

    def _build_train_loader(self) -> ODBLoader | PlannedLoader:
        if self.batching.policy.online:
            world_size, rank = self._world()
            timeout_s = self.batching.loader.alignment_timeout_s
            rendezvous, store = self._channel.for_loader("train", world_size, rank, timeout_s)
            seed = self.batching.seed
            if self.stream is not None:
                indices: dict[str, Any] = {"stream": self.stream}
            elif self.batching.policy.by_need:
                indices = {"order": TrainOrder(self.train_indices, seed)}
            else:
                indices = {"shard": TrainShard(self.train_indices, *self._world(), seed)}
            return ODBLoader(
                self.dataset,
                self.batching,
                **indices,
                rendezvous=rendezvous,
                metadata_store=store,
                pad_id=self.tokenizer.pad_id,
                max_seq_len=self.max_seq_len,
                vocab_size=self.run.vocab_size,
            )
        positions = epoch_plan(self.train_lengths, self.batching, len(self.train_indices))
        indices = self.train_indices

        def plan(epoch: int) -> list[list[int]]:
            return [[indices[p] for p in batch] for batch in positions(epoch)]

        return self._planned_loader(self.dataset, plan, self.loss_tokens)

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
        return self._keep(self._planned_loader(self.val_set, plan))

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
        return self._keep(self._planned_loader(subset, plan))

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

    def record_ids(self, indices: list[int]) -> list[str | int]:
        """The source's own ids of the records at dataset ``indices`` (the indices
        themselves for synthetic data, which has no records)."""
        dataset = self.dataset
        if not isinstance(dataset, ChatDataset) or self.stream is not None:
            return list(indices)  # streamed: the record's place among the file's records
        return [dataset.record_id(i) for i in indices]

    def data_identity(self) -> dict[str, Any]:
        """What makes a dataset index name the same record (known after ``setup``)."""
        settings = {"source": self.source, "regime": self.regime, "max_samples": self.max_samples}
        settings |= {"seed": self.batching.seed, "val_samples": self.val_samples}
        records = getattr(self.dataset, "records", None) or []
        if self.stream is not None:  # the file's fingerprint names its records
            settings["stream"] = Path(self.stream.directory).name
            records = []
        num_records = len(self.dataset) if self.dataset is not None else None
        return data_identity(settings, records, num_records, len(self.train_indices))

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

    # -- reporting ----------------------------------------------------------------------
    def run_report(self) -> RunReport:
        """This rank's report of the run for the summary builder."""
        facts = {
            "source": self.source,
            "regime": self.regime,
            "template": self.template,
            "max_seq_len": self.max_seq_len,
            "train_samples": self.num_train_samples,
            "length_cache_s": self.length_cache_s,
            "source_records": self.source_counts,
            # Source lines skipped as bad records (jsonl, batching.loader.on_bad_sample=skip);
            # the loader's own skips are skipped_bad_samples.
            "skipped_bad_records": self.source_counts.get("dropped/bad_record", 0),
            **self.train_record_counts,
        }
        if getattr(self, "resume_changed_settings", None):  # set by load_state_dict
            facts["resume_changed_settings"] = self.resume_changed_settings
        stats = self._train_loader.epoch_stats if self._train_loader else []
        return RunReport.of(self.batching, facts, stats)
