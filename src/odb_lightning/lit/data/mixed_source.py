"""The records of a mixture (``data.mixture``): each part read as its source alone would
be, the shares chosen (:mod:`odb_lightning.data.mixture`), said in the log one line a
part, and reported in the summary."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only

from odb_lightning.data.config import DataSource, MixturePart
from odb_lightning.data.mixture import MixedPart, MixedRecords, chosen_records, part_counts
from odb_lightning.data.record_table import RecordCache
from odb_lightning.data.sources.source_records import source_version
from odb_lightning.lit.data.chat_source import CachedLengths, ChatSource
from odb_lightning.lit.data.train_records import no_records_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixedSource(CachedLengths):
    """The parts of ``data.mixture`` (each with its source: ``data.source`` with the
    part's own fields), ``data.sizes.max_samples`` of the whole mixture, drawn by
    ``seed``."""

    parts: tuple[MixturePart, ...]
    sources: tuple[DataSource, ...]
    max_samples: int | float | None
    seed: int
    set_dir: str | None = None

    def _part(self, k: int) -> ChatSource:
        return ChatSource(self.sources[k], None, self.seed, self.set_dir)

    def arguments(self) -> dict[str, Any]:
        """What keys the mixture's length cache: every part's arguments, the version of
        its files and its share, the cap and the seed."""
        parts = [
            self._part(k).arguments()
            | part.settings()
            | {"version": source_version(self.sources[k].name, self.sources[k].path)}
            for k, part in enumerate(self.parts)
        ]
        return {"name": "mixture", "max_samples": self.max_samples, "seed": self.seed} | {
            "parts": parts
        }

    def read(
        self, on_bad_record: str, record_cache: RecordCache
    ) -> tuple[MixedRecords, dict[str, int], list[str]]:
        """The mixed records (every part read whole from its record table, then its share
        chosen), the counts summed over the parts (``kept``: the mixture's records), and
        every part's rejected lines.

        Raises:
            NoTrainingRecordsError: A part kept no record (naming its source).
        """
        counts: Counter[str] = Counter()
        rejected: list[str] = []
        read: list[Sequence[Any]] = []
        for k in range(len(self.parts)):
            records, part_counts_read, part_rejected = self._part(k).read(
                on_bad_record, record_cache
            )
            if not len(records):
                raise no_records_error(self.sources[k], part_counts_read, on_bad_record)
            counts.update(part_counts_read)
            rejected.extend(part_rejected)
            read.append(records)
        available = [len(r) for r in read]
        weights = [p.weight for p in self.parts]
        samples = [p.samples for p in self.parts]
        chosen = part_counts(weights, samples, available, self.max_samples)
        mixed = MixedRecords(
            [
                MixedPart(part.label or "", records, chosen_records(len(records), n, self.seed, k))
                for k, (part, records, n) in enumerate(zip(self.parts, read, chosen, strict=True))
            ]
        )
        counts["kept"] = len(mixed)
        if rank_zero_only.rank == 0:
            for line in self.describe(mixed, available):
                log.info("%s", line)
        return mixed, dict(counts), rejected

    def describe(self, mixed: MixedRecords, available: Sequence[int]) -> list[str]:
        """One line a part: its label, the records it gives of those it has, its share."""
        lines = []
        for part, piece, has in zip(self.parts, mixed.parts, available, strict=True):
            gives = len(piece.chosen)
            sized = f"samples={part.samples}" if part.samples else f"weight {part.weight or 1:g}"
            repeat = f", each record {gives / has:.2f} times on average" if gives > has else ""
            lines.append(
                f"mixture: {part.label} gives {gives:,} of its {has:,} records "
                f"({gives / len(mixed):.1%} of {len(mixed):,}; {sized}{repeat})"
            )
        return lines

    def report(self, mixed: MixedRecords) -> dict[str, dict[str, Any]]:
        """The summary's ``mixture`` entry before training: each part's weight or sample
        count, and its records in the mixture."""
        return {
            part.label or "": {
                "weight": part.weight if part.samples is None else None,
                "samples": part.samples,
                "records": len(piece.chosen),
                "share": len(piece.chosen) / len(mixed),
            }
            for part, piece in zip(self.parts, mixed.parts, strict=True)
        }

    def warn_partial_read(self, *args: Any) -> None:
        """Nothing to warn of: a mixture reads its parts whole (``max_samples`` caps the
        mixture, not a file)."""
