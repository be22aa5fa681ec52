"""Which records a chat data module reads, and reading them: the source's arguments (also
the length cache's key of the source), the records kept of those read, and their
counts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning.fabric.utilities.rank_zero import rank_zero_only

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.config import DataSource
from odb_lightning.data.formats import layout_read
from odb_lightning.data.length_pass import ExactLengths, exact_lengths
from odb_lightning.data.record_table import RecordCache
from odb_lightning.data.sizes import kept_records, records_to_read
from odb_lightning.data.sources.table import SourceRequest, resolve

log = logging.getLogger(__name__)
RecordT = TypeVar("RecordT")


def keep_records(
    records: Sequence[RecordT], counts: Mapping[str, int], max_samples: int | float | None
) -> tuple[Sequence[RecordT], dict[str, int]]:
    """The records kept of those a source read (``data.sizes.max_samples`` as a fraction keeps
    a share of them: a slice, which of a record table is a view of it) and the source's
    counts, with ``kept`` where some were left out."""
    num_kept = kept_records(max_samples, len(records))
    kept = records if num_kept == len(records) else records[:num_kept]
    counts = dict(counts)
    if len(kept) < len(records):
        counts["kept"] = len(kept)
    return kept, counts


class CachedLengths:
    """A source whose exact lengths the length pass caches under its :meth:`arguments`."""

    def arguments(self) -> dict[str, Any]:
        """What keys the source's length cache."""
        raise NotImplementedError

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
        ``batching``'s worker processes, cached in ``cache_dir`` under :meth:`arguments`
        (rank 0 builds the cache, the others wait at ``barrier``)."""
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


@dataclass(frozen=True)
class ChatSource(CachedLengths):
    """The records of ``data.source`` (an entry of the source table) in its regime,
    ``data.sizes.max_samples`` of them, drawn by ``seed``; a written image-text set goes
    under ``set_dir``."""

    source: DataSource
    max_samples: int | float | None
    seed: int
    set_dir: str | None = None

    def arguments(self) -> dict[str, Any]:
        """The source's arguments of :func:`~odb_lightning.data.load_source`, which also
        key its length cache."""
        arguments = {"name": self.source.name, "path": self.source.path} | {
            "regime": self.source.regime,
            "max_samples": records_to_read(self.max_samples),
            "seed": self.seed,
        }
        if self.source.format != "auto":
            arguments["format"] = self.source.format
        if self.source.mapping is not None:
            arguments["mapping"] = self.source.mapping.as_json()
        return arguments

    def request(self, on_bad_record: str, max_samples: int | None) -> SourceRequest:
        return SourceRequest(
            self.source.path, self.source.regime, max_samples, self.seed, on_bad_record,
            self.set_dir, self.source.format,
            self.source.mapping.as_json() if self.source.mapping is not None else None,
        )  # fmt: skip

    def read(
        self, on_bad_record: str, record_cache: RecordCache
    ) -> tuple[Sequence[Any], dict[str, int], list[str]]:
        """The records kept, read from their record table in ``record_cache`` (a source
        that is a table already: from it), the counts of what was read, kept and dropped,
        and the source's message of each line it rejected (``on_bad_record=skip``)."""
        request = self.request(on_bad_record, records_to_read(self.max_samples))
        records = self.source.entry.records(request, record_cache)
        if records.detected and rank_zero_only.rank == 0:
            layout = layout_read(records.detected, self.source.mapping)
            log.info("read %s as %s, %d records", self.source.path, layout, len(records))
        kept, counts = keep_records(records.records, records.counts, self.max_samples)
        return kept, counts, list(records.rejected)

    def whole_count(self, on_bad_record: str, record_cache: RecordCache) -> int | None:
        """The records of the whole source (every line of a file, ``max_samples``
        aside), where a table of it was converted already (a run without
        ``max_samples``); ``None`` where that is not known without reading it."""
        entry = self.source.entry
        if entry.reader is None or entry.image_file is not None:
            return None  # a table already, or a set written to size
        whole = resolve(entry.reader)(self.request(on_bad_record, None))
        return record_cache.converted_count(whole, "kept")

    def warn_partial_read(
        self, num_kept: int, on_bad_record: str, record_cache: RecordCache, origin: str | None
    ) -> None:
        """Warn (rank 0) that a file was read only up to ``max_samples`` records, so its
        other records are neither trained on nor checked, naming what set the limit
        (``origin``: a preset; ``None``: ``data.sizes.max_samples`` itself) and how to
        read them all."""
        limit = records_to_read(self.max_samples)
        path = self.source.path
        if path is None or limit is None or num_kept < limit or rank_zero_only.rank != 0:
            return
        if origin is None:
            origin = f"data.sizes.max_samples={limit}"
            fix = "data.sizes.max_samples=null reads every record"
        else:
            fix = f"drop {origin} to read every record"
        # Known without reading the file where a run read it whole before.
        whole = self.whole_count(on_bad_record, record_cache)
        of = f" of {whole:,}" if whole is not None else ""
        log.warning(
            "%s: read the first %d%s records of %s; the rest is not checked (%s)",
            origin, limit, of, path, fix,
        )  # fmt: skip
