"""Which records a chat data module reads, and reading them: the source's arguments (also
the length cache's key of the source), the records kept of those read, and their
counts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import load_source
from odb_lightning.data.length_pass import ExactLengths, exact_lengths
from odb_lightning.data.record_table import RecordCache
from odb_lightning.data.sizes import kept_records, records_to_read
from odb_lightning.data.sources import SourceName, source_reader

RecordT = TypeVar("RecordT")


def keep_records(
    records: Sequence[RecordT], counts: Mapping[str, int], max_samples: int | float | None
) -> tuple[Sequence[RecordT], dict[str, int]]:
    """The records kept of those a source read (``data.max_samples`` as a fraction keeps
    a share of them: a slice, which of a record table is a view of it) and the source's
    counts, with ``kept`` where some were left out."""
    num_kept = kept_records(max_samples, len(records))
    kept = records if num_kept == len(records) else records[:num_kept]
    counts = dict(counts)
    if len(kept) < len(records):
        counts["kept"] = len(kept)
    return kept, counts


@dataclass(frozen=True)
class ChatSource:
    """The records of ``data.source`` (``sharegpt``, ``chitchat``, ``ultrachat``,
    ``jsonl``) at ``data.path`` in ``data.regime``, ``data.max_samples`` of them, drawn by
    ``seed``."""

    name: str
    path: str | None
    regime: str
    max_samples: int | float | None
    seed: int

    def arguments(self) -> dict[str, Any]:
        """The source's arguments of :func:`~odb_lightning.data.load_source`, which also
        key its length cache."""
        return {"name": self.name, "path": self.path, "regime": self.regime} | {
            "max_samples": records_to_read(self.max_samples),
            "seed": self.seed,
        }

    def read(
        self, on_bad_record: str, record_cache: RecordCache
    ) -> tuple[Sequence[Any], dict[str, int], list[str]]:
        """The records kept, read from their record table in ``record_cache`` (UltraChat:
        from its parquet table), the counts of what was read, kept and dropped, and the
        source's message of each line it rejected (``on_bad_record=skip``)."""
        arguments = self.arguments()
        records = load_source(
            arguments.pop("name"),
            **arguments,
            on_bad_record=on_bad_record,
            record_cache=record_cache,
        )
        kept, counts = keep_records(records.records, records.counts, self.max_samples)
        return kept, counts, list(records.rejected)

    def whole_count(self, on_bad_record: str, record_cache: RecordCache) -> int | None:
        """The records of the whole source (every line of a file, ``max_samples``
        aside), where a table of it was converted already (a run without
        ``max_samples``); ``None`` where that is not known without reading it."""
        if self.name not in set(SourceName) or SourceName(self.name) is SourceName.ULTRACHAT:
            return None  # a table already, or a source this reader does not read (images)
        whole = source_reader(
            self.name, path=self.path, regime=self.regime, max_samples=None, seed=self.seed,
            on_bad_record=on_bad_record,
        )  # fmt: skip
        return record_cache.converted_count(whole, "kept")

    def exact_lengths(
        self,
        dataset: Any,
        cache_dir: str | None,
        batching: BatchingConfig,
        world_size: int,
        rank: int,
        barrier: Callable[[], None],
    ) -> ExactLengths:
        """Every record's exact length and supervised tokens: the length pass, in
        ``batching``'s worker processes, cached in ``cache_dir`` under this source's
        arguments (rank 0 builds the cache, the others wait at ``barrier``)."""
        method = batching.loader.multiprocessing_context
        return exact_lengths(
            dataset,
            self.arguments(),
            cache_dir,
            num_workers=batching.loader.num_workers,
            multiprocessing_context=None if method is None else method.value,
            rank=rank,
            world_size=world_size,
            barrier=barrier,
        )
