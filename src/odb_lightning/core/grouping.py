"""Local grouping: sort the window longest first and cut it into budget-sized groups."""

from __future__ import annotations

from collections.abc import Iterable

from odb_lightning.core.budget import Budget
from odb_lightning.core.patch_budget import PatchBudget
from odb_lightning.core.types import Group, SampleInfo


def sort_longest_first(samples: Iterable[SampleInfo]) -> list[SampleInfo]:
    """Length descending; ties by arrival position so the order is deterministic."""
    return sorted(samples, key=lambda s: (-s.length, s.position))


def padded_cuts(ordered: list[SampleInfo], budget: Budget, cap: int | None = None) -> list[int]:
    """Group start positions of the padded partition of ``ordered`` (longest first).

    A group starting at ``i`` may take up to ``c_i = max(1, floor(budget / row_cost(L_i)))``
    adjacent samples (capped by ``cap``): every later sample is no longer, so the group is
    within budget. Returns the cut with the fewest groups and, among those, the least cost
    ``sum(size x row_cost(longest))`` (padded tokens when ``attention_weight`` is 0); on
    exact ties the larger first group. Greedy (``c_i`` at every cut) already gives the
    fewest groups (its k-th cut is never behind any other's, and ``c_i`` grows as lengths
    shrink) but leaves all the slack to the shortest group; this spends it where it saves
    the most padding.

    Suffix dynamic program by group count: ``fewest(j)`` for ``ordered[j:]`` never grows
    with ``j``, so the starts needing ``k + 1`` groups form one run just left of the run
    needing ``k`` and end their first group inside it. Between two runs the cost
    ``(j - i) x row_cost(L_i)`` is Monge (``row_cost`` falls as ``i`` grows), so the best
    end moves right with the start and each run is solved by divide and conquer:
    ``O(n log n)`` in all.
    """
    n = len(ordered)
    # The budget's figures depend on the length alone: ask once per distinct length.
    lengths = [s.length for s in ordered]
    figures = {m: (budget.max_group_size(m), budget.row_cost(m)) for m in set(lengths)}
    sizes = [figures[m][0] for m in lengths]
    if cap is not None:
        sizes = [min(size, cap) for size in sizes]
    reach = [min(n, i + size) for i, size in enumerate(sizes)]  # never falls as i grows
    row = [figures[m][1] for m in lengths]
    cost = [0.0] * (n + 1)  # least cost of ordered[j:] with the fewest groups
    end = [n] * (n + 1)  # where the first group of ordered[j:] ends
    run_start = n  # the run of starts solved last: [run_start, previous run_start)
    while run_start > 0:
        first = run_start
        while first > 0 and reach[first - 1] >= run_start:
            first -= 1
        _best_ends(first, run_start - 1, run_start, n, reach, row, cost, end)
        run_start = first
    cuts, i = [], 0
    while i < n:
        cuts.append(i)
        i = end[i]
    return cuts


def _best_ends(
    lo: int,
    hi: int,
    col_lo: int,
    col_hi: int,
    reach: list[int],
    row: list[float],
    cost: list[float],
    end: list[int],
) -> None:
    # Starts lo..hi end their first group in [col_lo, min(col_hi, reach[i])]; the best end
    # of the middle start bounds the ends of the starts on either side of it.
    if lo > hi:
        return
    mid = (lo + hi) // 2
    best = min(col_hi, reach[mid])
    best_cost = cost[best] + (best - mid) * row[mid]
    for j in range(best - 1, col_lo - 1, -1):
        total = cost[j] + (j - mid) * row[mid]
        if total < best_cost:  # strict: ties keep the larger first group
            best, best_cost = j, total
    cost[mid], end[mid] = best_cost, best
    _best_ends(lo, mid - 1, col_lo, best, reach, row, cost, end)
    _best_ends(mid + 1, hi, best, col_hi, reach, row, cost, end)


def greedy_cuts(
    ordered: list[SampleInfo],
    budget: Budget,
    *,
    patch_budget: PatchBudget | None = None,
    cap: int | None = None,
) -> list[int]:
    """Group start positions where each group takes adjacent samples while the token
    cost fits (:meth:`~odb_lightning.core.budget.Budget.fits_group`, the layout's) and,
    with a ``patch_budget``, the group's summed
    :meth:`~odb_lightning.core.patch_budget.PatchBudget.sample_cost`. Both costs only fall
    when a sample leaves a group of adjacent samples, so the greedy cut has the fewest
    groups (:mod:`~odb_lightning.core.patch_budget`); a budget without padding to balance
    (``balances_padding`` false) takes it as final. A sample that alone breaks a budget
    is a group of one."""
    cuts, start = [], 0
    while start < len(ordered):
        cuts.append(start)
        first = ordered[start]
        total, squares, patches = first.length, first.length * first.length, 0.0
        if patch_budget is not None:
            patches = patch_budget.sample_cost(first.num_patches, first.patch_square_sum)
        size = 1
        while start + size < len(ordered) and (cap is None or size < cap):
            nxt = ordered[start + size]
            total, squares = total + nxt.length, squares + nxt.length * nxt.length
            tokens_fit = budget.fits_group(size + 1, first.length, total, squares)
            if patch_budget is not None:
                patches += patch_budget.sample_cost(nxt.num_patches, nxt.patch_square_sum)
            if not tokens_fit or (patch_budget is not None and patches > patch_budget.max_patches):
                break
            size += 1
        start += size
    return cuts


def group_window(
    samples: Iterable[SampleInfo],
    budget: Budget,
    *,
    max_group_size: int | None = None,
    patch_budget: PatchBudget | None = None,
) -> list[Group]:
    """Sort the window longest first and cut it into adjacent groups
    (:func:`padded_cuts` for a budget that balances padding on tokens alone, else
    :func:`greedy_cuts`: one row per group, or a ``patch_budget`` too). An over-budget
    sample becomes a group of one; ``max_group_size`` caps every group.

    Returns:
        Groups in longest-first order, every sample in exactly one group.
    """
    ordered = sort_longest_first(samples)
    if not budget.balances_padding or patch_budget is not None:
        cuts = greedy_cuts(ordered, budget, patch_budget=patch_budget, cap=max_group_size)
    else:
        cuts = padded_cuts(ordered, budget, max_group_size)
    bounds = [*cuts, len(ordered)]
    return [Group(tuple(ordered[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]


def group_lengths(
    lengths: list[int], budget: Budget, *, max_group_size: int | None = None
) -> list[list[int]]:
    """Group indices of ``lengths`` longest first (offline form of :func:`group_window`)."""
    samples = [SampleInfo(sample_id=i, length=n, position=i) for i, n in enumerate(lengths)]
    groups = group_window(samples, budget, max_group_size=max_group_size)
    return [[s.sample_id for s in g.samples] for g in groups]
