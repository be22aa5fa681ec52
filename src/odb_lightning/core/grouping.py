"""Local grouping: sort the window longest first and cut it into budget-sized groups."""

from __future__ import annotations

from collections.abc import Iterable

from odb_lightning.core.budget import Budget
from odb_lightning.core.types import Group, SampleInfo


def sort_longest_first(samples: Iterable[SampleInfo]) -> list[SampleInfo]:
    """Length descending; ties by arrival position so the order is deterministic."""
    return sorted(samples, key=lambda s: (-s.length, s.position))


def group_window(samples: Iterable[SampleInfo], budget: Budget) -> list[Group]:
    """Greedy longest-first grouping.

    Walks the window from the longest sample down; each group takes
    ``max(1, floor(budget / L))`` adjacent samples, where ``L`` is the length of the
    group's first (longest) sample. Adjacent samples are at most as long, so every
    multi-sample group is within budget; an over-budget sample becomes a group of one.

    Returns:
        Groups in longest-first order, every sample in exactly one group.
    """
    ordered = sort_longest_first(samples)
    groups: list[Group] = []
    start = 0
    while start < len(ordered):
        size = budget.max_group_size(ordered[start].length)
        groups.append(Group(tuple(ordered[start : start + size])))
        start += size
    return groups


def group_lengths(lengths: list[int], budget: Budget) -> list[list[int]]:
    """Group indices of ``lengths`` longest first (offline form of :func:`group_window`)."""
    samples = [SampleInfo(sample_id=i, length=n, position=i) for i, n in enumerate(lengths)]
    return [[s.sample_id for s in g.samples] for g in group_window(samples, budget)]
