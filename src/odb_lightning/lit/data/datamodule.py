"""``ODBDataModule``: a chat source, the tokenizer and a batching mode, as one Lightning
data module that builds one loader per rank with explicit per-rank sharding."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np
from torch.utils.data import Dataset, Subset
from typing_extensions import override

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.config import (
    DataCaches,
    DataSizes,
    DataSource,
    mixture_parts,
    split_concerns,
)
from odb_lightning.data.dataset import ChatDataset
from odb_lightning.data.mixture import MixedRecords
from odb_lightning.data.record_table import RecordCache, default_record_cache_dir
from odb_lightning.data.sizes import records_to_read
from odb_lightning.data.sources.table import SourceKind, source_named
from odb_lightning.data.synthetic import SyntheticDataset
from odb_lightning.data.template_choice import resolve_template_name
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.lit.callbacks.run_report import RunReport
from odb_lightning.lit.data.batched import BatchedDataModule
from odb_lightning.lit.data.chat_source import ChatSource
from odb_lightning.lit.data.evaluation_split import hold_out, without_augmentation
from odb_lightning.lit.data.mixed_source import MixedSource
from odb_lightning.lit.data.resume_state import (
    data_identity,
    data_settings,
)
from odb_lightning.lit.data.skipped_records import report_skipped
from odb_lightning.lit.data.streaming import check_streaming, open_stream
from odb_lightning.lit.data.train_records import (
    count_train_records,
    no_records_error,
    refuse_unsupervised,
)
from odb_lightning.lit.run_context import RunContext

log = logging.getLogger(__name__)


class ODBDataModule(BatchedDataModule):
    """Chat data, tokenized in the loader workers, batched by the configured mode.

    Checkpoints resume mid-epoch exactly (``docs/design.md``, "The resume protocol"): the
    batches a step has taken are counted in :meth:`on_before_batch_transfer`, so a
    LightningModule that overrides that hook defers to this one.

    Args:
        tokenizer: The chat tokenizer (``tokenizer`` config group).
        batching: The batching mode and every loader knob (``batching`` config group);
            its ``seed`` also draws the validation split.
        source, sizes, caches: The data concerns (``data.source``, ``data.sizes``,
            ``data.caches``; :mod:`odb_lightning.data.config`, each field documented
            there). The source is a text source of the source table; its template is
            chosen and checked against the tokenizer now.
        streaming: Stream the records of a JSON Lines file, each rank its own part in
            order, never the whole set (:mod:`odb_lightning.lit.data.streaming` says what
            it refuses).
        run: The run's context (from the app): the vocabulary the loaders check token ids
            against, the training sample count this module fills at ``setup``, and the run
            directory, where ``skipped_records.jsonl`` names the records read but not
            trained on. ``None``: no vocabulary check, a count of its own, and no file.
        max_samples_from: What set ``sizes.max_samples`` when a preset did (``debug=smoke``),
            named in the warning that a file was read only in part.
        mixture: Several sources in one run (``data.mixture``: a list of
            :class:`~odb_lightning.data.config.MixturePart` fields, each a mapping), read
            instead of ``source``'s name, path and layout; ``source``'s template, system
            prompt and augmentation hold for every part. Not streamed.
    """

    KINDS = (SourceKind.CHAT, SourceKind.TOKENS)
    """The kinds of source this module reads (the source table's)."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        batching: BatchingConfig,
        source: DataSource | None = None,
        sizes: DataSizes | None = None,
        caches: DataCaches | None = None,
        streaming: bool = False,
        run: RunContext | None = None,
        max_samples_from: str | None = None,
        mixture: Sequence[Any] | None = None,
    ) -> None:
        sizes = sizes if sizes is not None else DataSizes()
        super().__init__(batching, tokenizer.pad_id, sizes.max_seq_len, run)
        self.source = source if source is not None else DataSource()
        self.sizes = sizes
        self.caches = caches if caches is not None else DataCaches()
        self.entry = source_named(self.source.name, self.KINDS)
        chat = (SourceKind.CHAT,)
        self.mixture, self.mixture_sources = mixture_parts(mixture, self.source, chat)
        if self.mixture and streaming:
            raise ValueError(
                "data.mixture is read through record tables, which data.streaming=true does "
                "not use: set data.streaming=false (or stream one source)"
            )
        self.mixture_report: dict[str, dict[str, Any]] = {}  # each part's share, at setup
        if self.entry.kind is not SourceKind.TOKENS:  # a wrong template fails now, its
            resolve_template_name(tokenizer, self.source.template)  # message naming the key
        self.tokenizer = tokenizer
        self.max_samples_from = max_samples_from
        self.record_cache = RecordCache(self.caches.record_dir or default_record_cache_dir())
        self.streaming = streaming
        if streaming:
            check_streaming(self.source, self.sizes, batching, self.caches.stream_dir)
        self.length_cache_s: float | None = None
        self.source_counts: dict[str, int] = {}  # records read, kept, dropped (by reason)
        self.source_rejected: list[str] = []  # the source's message of each line it skipped
        # Training records without supervised tokens / truncated (see setup).
        self.train_record_counts: dict[str, int] = {}

    @classmethod
    def of(cls, tokenizer: ChatTokenizer, batching: BatchingConfig, **fields: Any) -> Self:
        """The keyword form: every data field by its own name (``name="jsonl", path=...,
        max_seq_len=..., record_dir=...``), routed to its concern
        (:func:`~odb_lightning.data.config.split_concerns`); the other keywords are this
        class's own (``streaming``, ``run``, ...)."""
        concerns, rest = split_concerns(fields)
        return cls(tokenizer, batching, **concerns, **rest)

    # -- data ---------------------------------------------------------------------------
    def _chat_source(self) -> ChatSource | MixedSource:
        set_dir, seed = self.caches.image_set_dir, self.batching.seed
        if self.mixture:
            sources = self.mixture_sources
            return MixedSource(self.mixture, sources, self.sizes.max_samples, seed, set_dir)
        return ChatSource(self.source, self.sizes.max_samples, seed, set_dir)

    def _read_records(self) -> Sequence[Any]:
        """The records kept of the source, with its counts noted; warns of a file read in
        part."""
        source, on_bad_record = self._chat_source(), self.batching.loader.on_bad_sample.value
        kept, self.source_counts, self.source_rejected = source.read(
            on_bad_record, self.record_cache
        )
        if isinstance(source, MixedSource) and isinstance(kept, MixedRecords):
            self.mixture_report = source.report(kept)
        source.warn_partial_read(len(kept), on_bad_record, self.record_cache, self.max_samples_from)
        return kept

    def _load_dataset(self) -> Dataset:
        if self.entry.kind is SourceKind.TOKENS:
            return SyntheticDataset.from_profile(
                self.source.regime,
                records_to_read(self.sizes.max_samples) or 1024,
                max_seq_len=self.max_seq_len,
                seed=self.batching.seed,
            )
        return ChatDataset(
            self._read_records(),
            self.tokenizer,
            self.max_seq_len,
            self.source.system_prompt,
            augmentation=self.source.augmentation,
            template=self.source.template,
            truncation=self.sizes.truncation,
            think_block=self.source.think_block,
            supervise=self.source.supervise,
        )

    def _open_stream(self) -> None:
        """The stream of the file (written once as chunks) and its tokenizing dataset."""
        on_bad_record = self.batching.loader.on_bad_sample.value
        self.stream, self.dataset = open_stream(
            self.source, self.sizes, self.caches, self.tokenizer, on_bad_record,
        )  # fmt: skip
        self.source_counts = dict(self.stream.counts)
        self.train_indices = range(self.stream.num_records)  # type: ignore[assignment]
        self.run.train_samples.set(self.stream.num_records)

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
            on_bad_record = self.batching.loader.on_bad_sample.value
            raise no_records_error(self.source, self.source_counts, on_bad_record)
        records = getattr(dataset, "records", None)
        if isinstance(records, MixedRecords):  # each part held out in proportion
            val_indices, self.train_indices = records.hold_out(
                self.sizes.val_samples, self.batching.seed
            )
        else:
            val_indices, self.train_indices = hold_out(
                len(dataset), self.sizes.val_samples, self.batching.seed
            )
        self.num_val_samples = len(val_indices)
        self.dataset = dataset
        self.val_set = Subset(without_augmentation(dataset), val_indices)
        if self.batching.policy.needs_length_pass:
            source, barrier = self._chat_source(), self._length_cache_barrier
            exact = source.exact_lengths(
                dataset, self.caches.length_dir, self.batching, *self._world(), barrier
            )
            train = np.asarray(self.train_indices, dtype=np.int64)
            self.train_lengths = exact.lengths[train].tolist()
            self.loss_tokens, self.length_cache_s = exact.num_loss_tokens, exact.build_s
        self.run.train_samples.set(len(self.train_indices))
        self.train_record_counts, unsupervised = count_train_records(
            dataset, self.train_indices, self.train_lengths, self.loss_tokens, self.max_seq_len
        )
        name = "mixture" if self.mixture else self.source.name
        report_skipped(
            name, self.source_counts, self.source_rejected, self.record_ids(unsupervised),
            self.loss_tokens is not None, self.run.output_dir,
        )  # fmt: skip
        read = self.source_counts.get("read", len(dataset))
        refuse_unsupervised(
            self.source, read, len(self.train_indices), len(unsupervised), self.max_seq_len,
            exact=self.loss_tokens is not None,
        )  # fmt: skip

    def _length_cache_barrier(self) -> None:
        if self.trainer is not None:  # without one (odb-preview) this is the only process
            self.trainer.strategy.barrier("odb-length-cache")

    def mixed_records(self) -> MixedRecords | None:
        """The records of ``data.mixture`` (after ``setup``; ``None`` without one)."""
        records = getattr(self.dataset, "records", None)
        return records if isinstance(records, MixedRecords) else None

    def record_ids(self, indices: list[int]) -> list[str | int]:
        """The source's own ids of the records at dataset ``indices`` (the indices
        themselves for synthetic data, which has no records)."""
        dataset = self.dataset
        if not isinstance(dataset, ChatDataset) or self.stream is not None:
            return list(indices)  # streamed: the record's place among the file's records
        return [dataset.record_id(i) for i in indices]

    @property
    def template_name(self) -> str:
        """The chat template the records are rendered with: ``data.source.template``, or
        after ``setup`` the layout it settled on (``auto``'s choice)."""
        template = getattr(self.dataset, "template", None)
        return template.name.value if template is not None else self.source.template

    def data_identity(self) -> dict[str, Any]:
        """What makes a dataset index name the same record (known after ``setup``)."""
        settings = data_settings(self.source, self.sizes, self.batching.seed)
        if self.mixture:
            settings["mixture"] = [part.settings() for part in self.mixture]
        records = getattr(self.dataset, "records", None) or []
        if self.stream is not None:  # the file's fingerprint names its records
            settings["stream"] = Path(self.stream.directory).name
            records = []
        num_records = len(self.dataset) if self.dataset is not None else None
        return data_identity(settings, records, num_records, len(self.train_indices))

    # -- reporting ----------------------------------------------------------------------
    def run_report(self) -> RunReport:
        """This rank's report of the run for the summary builder."""
        facts = {
            "source": "mixture" if self.mixture else self.source.name,
            "regime": self.source.regime,
            "template": self.template_name,
            "max_seq_len": self.max_seq_len,
            "train_samples": self.num_train_samples,
            "length_cache_s": self.length_cache_s,
            "source_records": self.source_counts,
            # Source lines skipped as bad records (jsonl, batching.loader.on_bad_sample=skip);
            # the loader's own skips are skipped_bad_samples.
            "skipped_bad_records": self.source_counts.get("dropped/bad_record", 0),
            **self.train_record_counts,
        }
        if self.mixture_report:
            facts["mixture"] = self.mixture_report
        if self.resume_changed_settings:
            facts["resume_changed_settings"] = self.resume_changed_settings
        stats = self._train_loader.epoch_stats if self._train_loader else []
        return RunReport.of(self.batching, facts, stats)
