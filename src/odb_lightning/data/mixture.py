"""A mixture of sources as one sequence of records: how many records each part gives
(:func:`part_counts`), which ones (a seeded choice), and the records in one index space
(:class:`MixedRecords`) that batching, the id audit and resume see as any source's.

The mixture's order is the batching's own: a seeded permutation of the dataset indices,
the same on every rank and restored exactly on resume, so the parts are interleaved at
random and every epoch holds each part's share exactly. The validation hold-out is drawn
per part in proportion (:meth:`MixedRecords.hold_out`), so the training records keep the
shares too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.profiles import largest_remainder
from odb_lightning.data.sizes import validation_count


def part_counts(
    weights: Sequence[float | None],
    samples: Sequence[int | None],
    available: Sequence[int],
    limit: int | float | None = None,
) -> list[int]:
    """The records each part gives to the mixture.

    Args:
        weights: Each part's weight (``None`` where it gives ``samples``, or where
            neither is set: weight 1).
        samples: Each part's record count (``None``: weighted).
        available: Records each part read.
        limit: ``data.sizes.max_samples``: a count or a fraction of the whole mixture,
            every part scaled alike (``None``: no cap).

    Weighted parts share in proportion as many records as the first of them to run out
    allows, so none repeats; a part with ``samples`` gives that many.
    """
    counts = [s or 0 for s in samples]
    weighted = [k for k, s in enumerate(samples) if s is None]
    if weighted:
        share = [weights[k] or 1.0 for k in weighted]
        whole = sum(share)
        pairs = zip(weighted, share, strict=True)
        total = min(math.floor(available[k] * whole / w + 1e-9) for k, w in pairs)
        for k, n in zip(weighted, largest_remainder(share, total), strict=True):
            counts[k] = min(n, available[k])
    if limit is not None:
        whole_mix = sum(counts)
        cap = max(1, math.floor(limit * whole_mix)) if isinstance(limit, float) else int(limit)
        if cap < whole_mix:
            counts = largest_remainder(counts, cap)
    return counts


def chosen_records(available: int, count: int, seed: int, part: int) -> np.ndarray:
    """Which of a part's ``available`` records the mixture takes, ``count`` of them, drawn
    by ``seed`` and the part's place (sorted, so reads follow the file): every record
    ``count // available`` times, the rest a seeded choice without repeats."""
    rng = np.random.default_rng([seed, part])
    copies, rest = divmod(count, available)
    extra = np.sort(rng.permutation(available)[:rest])
    return np.concatenate([np.tile(np.arange(available), copies), extra]).astype(np.int64)


@dataclass(frozen=True)
class MixedPart:
    """One part of a mixture: its label, its records and the ones chosen of them."""

    label: str
    records: Sequence[Any]
    chosen: np.ndarray


class MixedRecords(Sequence[Any]):
    """The chosen records of every part in one index space, part after part; each record
    as its part has it, its id prefixed with the part's label (``chats.jsonl:17``).

    Picklable (the loader workers read from it) as its parts' records are.
    """

    def __init__(self, parts: Sequence[MixedPart]) -> None:
        self.parts = tuple(parts)
        self.offsets = np.cumsum([0] + [len(p.chosen) for p in self.parts]).astype(np.int64)

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.parts]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"mixture index {index} out of range ({len(self)} records)")
        index %= len(self)
        k = int(np.searchsorted(self.offsets, index, side="right")) - 1
        part = self.parts[k]
        record = part.records[int(part.chosen[index - self.offsets[k]])]
        return {**record, "id": f"{part.label}:{record['id']}"}

    def part_of(self, indices: Sequence[int]) -> np.ndarray:
        """The part (its place in :attr:`parts`) of each dataset index."""
        where = np.searchsorted(self.offsets, np.asarray(indices, dtype=np.int64), side="right")
        return where - 1

    @property
    def supervised(self) -> np.ndarray:
        """Whether each record has an assistant turn, from the parts' tables (every part
        a record table; ``AttributeError`` otherwise, and the caller scans the turns)."""
        return np.concatenate([np.asarray(p.records.supervised)[p.chosen] for p in self.parts])

    def hold_out(self, val_samples: int | float | None, seed: int) -> tuple[list[int], list[int]]:
        """The validation and training indices, each sorted: ``val_samples`` of the mixture
        (:func:`~odb_lightning.data.sizes.validation_count`), drawn from each part in
        proportion to its records, by ``seed``.

        Raises:
            ValueError: ``val_samples`` leaves a part without training records.
        """
        num_val = validation_count(val_samples, len(self))
        sizes = [len(p.chosen) for p in self.parts]
        shares = largest_remainder(sizes, num_val) if num_val else [0] * len(sizes)
        val: list[int] = []
        train: list[int] = []
        for k, (size, take) in enumerate(zip(sizes, shares, strict=True)):
            if take and take >= size:
                raise ValueError(
                    f"val_samples ({val_samples}) leaves part {self.parts[k].label!r} of the "
                    f"mixture ({size} records) no training record; hold out fewer records"
                )
            order = epoch_permutation(size, seed + k, epoch=-1)
            first = int(self.offsets[k])
            val.extend(first + int(i) for i in order[:take])
            train.extend(first + int(i) for i in order[take:])
        return sorted(val), sorted(train)
