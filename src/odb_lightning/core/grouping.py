"""Local grouping: sort the window longest first and cut it into budget-sized groups."""

from __future__ import annotations

from collections.abc import Iterable

from odb_lightning.core.budget import Budget
from odb_lightning.core.types import Group, SampleInfo


def sort_longest_first(samples: Iterable[SampleInfo]) -> list[SampleInfo]:
    """Length descending; ties by arrival position so the order is deterministic."""
    return sorted(samples, key=lambda s: (-s.length, s.position))


def _padded_size(ordered: list[SampleInfo], start: int, budget: Budget) -> int:
    # Every later sample is at most as long as ordered[start], so g rows of its length fit.
    return budget.max_group_size(ordered[start].length)


def _packed_size(ordered: list[SampleInfo], start: int, budget: Budget) -> int:
    # Packed rows are concatenated without padding: the cost is the sum of row costs.
    cost, size = budget.row_cost(ordered[start].length), 1
    while start + size < len(ordered):
        cost += budget.row_cost(ordered[start + size].length)
        if cost > budget.token_budget:
            break
        size += 1
    return size


def group_window(
    samples: Iterable[SampleInfo],
    budget: Budget,
    *,
    packed: bool = False,
    max_group_size: int | None = None,
) -> list[Group]:
    """Greedy longest-first grouping.

    Walks the window from the longest sample down. Padded: each group takes
    ``max(1, floor(budget / L))`` adjacent samples, where ``L`` is its first (longest)
    sample's length; later samples are no longer, so every multi-sample group is within
    budget. Packed: each group takes adjacent samples while the sum of their lengths fits.
    Either way an over-budget sample becomes a group of one, and ``max_group_size`` caps
    every group.

    Returns:
        Groups in longest-first order, every sample in exactly one group.
    """
    ordered = sort_longest_first(samples)
    size_at = _packed_size if packed else _padded_size
    groups: list[Group] = []
    start = 0
    while start < len(ordered):
        size = size_at(ordered, start, budget)
        if max_group_size is not None:
            size = min(size, max_group_size)
        groups.append(Group(tuple(ordered[start : start + size])))
        start += size
    return groups


def group_lengths(
    lengths: list[int],
    budget: Budget,
    *,
    packed: bool = False,
    max_group_size: int | None = None,
) -> list[list[int]]:
    """Group indices of ``lengths`` longest first (offline form of :func:`group_window`)."""
    samples = [SampleInfo(sample_id=i, length=n, position=i) for i, n in enumerate(lengths)]
    groups = group_window(samples, budget, packed=packed, max_group_size=max_group_size)
    return [[s.sample_id for s in g.samples] for g in groups]
