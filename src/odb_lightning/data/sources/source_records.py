"""What a source hands back: its records plus counts of what it dropped and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

from odb_lightning.data.conversation import ChatRecord


def checked_max_samples(max_samples: int | None) -> int | None:
    """``max_samples`` if it is ``None`` or a non-negative int; raise otherwise."""
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 0):
        raise ValueError(f"max_samples must be >= 0 or None, got {max_samples!r}")
    return max_samples


def take(records: Iterable[ChatRecord], max_samples: int | None) -> Iterator[ChatRecord]:
    """The first ``max_samples`` records (all when ``None``)."""
    return islice(records, checked_max_samples(max_samples))


@dataclass
class SourceRecords:
    """Records of one source plus what was dropped on the way, and why.

    Attributes:
        name: Source name (``"sharegpt"``, ``"jsonl"``, ...).
        records: The conversations, a random-access sequence.
        counts: ``"read"`` (raw records seen), ``"kept"``, and one ``"dropped/<reason>"``
            entry per reason, so nothing is lost silently.
        rejected: Why each record dropped as bad was rejected (location, field, problem).
    """

    name: str
    records: Sequence[ChatRecord]
    counts: Counter[str] = field(default_factory=Counter)
    rejected: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)
