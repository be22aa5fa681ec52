"""Local grouping: sort the window longest first and cut it into budget-sized groups."""

from __future__ import annotations

from collections.abc import Iterable

from odb_lightning.core.budget import Budget
from odb_lightning.core.types import Group, SampleInfo


def sort_longest_first(samples: Iterable[SampleInfo]) -> list[SampleInfo]:
    """Length descending; ties by arrival position so the order is deterministic."""
    return sorted(samples, key=lambda s: (-s.length, s.position))


def padded_cuts(ordered: list[SampleInfo], budget: Budget, cap: int | None = None) -> list[int]:
    """Group start positions of the padded partition of ``ordered`` (longest first).

    A group starting at ``i`` may take up to ``c_i = max(1, floor(budget / row_cost(L_i)))``
    adjacent samples (capped by ``cap``): every later sample is no longer, so the group is
    within budget. Among such cuts this returns one with the fewest groups and, among
    those, the least padded cost ``sum(size x row_cost(longest))``; ties go to the larger
    first group.

    Taking ``c_i`` samples at every cut (the plain greedy rule) already gives the fewest
    groups: its k-th cut is never behind any other cut's k-th, and ``c_i`` grows as the
    lengths shrink. What is left to choose is where the groups that are not full fall;
    greedy leaves all the slack to the shortest group; this spends it where it saves the
    most padding. Suffix dynamic program, ``O(n x c)``.
    """
    n = len(ordered)
    sizes = [budget.max_group_size(s.length) for s in ordered]
    if cap is not None:
        sizes = [min(size, cap) for size in sizes]
    groups = [0] * (n + 1)  # fewest groups for ordered[j:]
    cost = [0.0] * (n + 1)  # least padded cost of ordered[j:] with that many groups
    end = [n] * (n + 1)  # where the first group of ordered[j:] ends
    # groups[j] never grows with j (a shorter suffix needs no more groups), so the ends
    # with the fewest groups form one run; level_start[v] is where the run of v begins.
    level_start = [n]
    for i in range(n - 1, -1, -1):
        last = min(n, i + sizes[i])
        fewest = groups[last]
        row = budget.row_cost(ordered[i].length)
        best, best_cost = last, cost[last] + (last - i) * row
        for j in range(last - 1, max(i + 1, level_start[fewest]) - 1, -1):
            total = cost[j] + (j - i) * row
            if total < best_cost:  # strict: ties keep the larger first group
                best, best_cost = j, total
        groups[i], cost[i], end[i] = fewest + 1, best_cost, best
        if fewest + 1 == len(level_start):
            level_start.append(i)
        else:
            level_start[fewest + 1] = i
    cuts, i = [], 0
    while i < n:
        cuts.append(i)
        i = end[i]
    return cuts


def packed_cuts(ordered: list[SampleInfo], budget: Budget, cap: int | None = None) -> list[int]:
    """Group start positions of the packed partition: each group takes adjacent samples
    while the sum of their row costs fits (packed rows carry no padding, so there is no
    padding to balance and the greedy cut is final)."""
    cuts, start = [], 0
    while start < len(ordered):
        cuts.append(start)
        cost, size = budget.row_cost(ordered[start].length), 1
        while start + size < len(ordered) and (cap is None or size < cap):
            cost += budget.row_cost(ordered[start + size].length)
            if cost > budget.token_budget:
                break
            size += 1
        start += size
    return cuts


def group_window(
    samples: Iterable[SampleInfo],
    budget: Budget,
    *,
    packed: bool = False,
    max_group_size: int | None = None,
) -> list[Group]:
    """Longest-first grouping of one window.

    Sorts the window longest first and cuts it into adjacent groups. Padded: the fewest
    groups of at most ``max(1, floor(budget / L))`` samples (``L`` the group's first,
    longest sample), with the least padding among those (:func:`padded_cuts`). Packed:
    each group takes samples while the sum of their lengths fits (:func:`packed_cuts`).
    Either way an over-budget sample becomes a group of one, and ``max_group_size`` caps
    every group.

    Returns:
        Groups in longest-first order, every sample in exactly one group.
    """
    ordered = sort_longest_first(samples)
    cut = packed_cuts if packed else padded_cuts
    bounds = [*cut(ordered, budget, max_group_size), len(ordered)]
    return [Group(tuple(ordered[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]


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
