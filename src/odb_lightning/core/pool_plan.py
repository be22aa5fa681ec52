"""The plan of a pooled round: the union of every rank's offered samples grouped as one
window and handed out ``W`` groups per step position.

Step position ``t`` takes the ``t``-th ``W`` groups in cost order, so the ranks' costs at
a position are as close as the groups allow, and each group goes to the rank that holds
most of its samples, so as few samples move as the grouping allows. A round whose ranks'
own groups reach the union's level within
:data:`~odb_lightning.core.locality.LEVEL_TOLERANCE` keeps them where they were fetched
instead and pools only the rest (:mod:`~odb_lightning.core.locality`). Everything here is a
pure function of the offers, so every rank computes the same :class:`PoolPlan`; when a
round pools and what each window does with the plan is
:class:`~odb_lightning.core.pooling.PooledRound`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from odb_lightning.core.alignment import split_groups
from odb_lightning.core.budget import Budget
from odb_lightning.core.grouping import group_window
from odb_lightning.core.locality import LEVEL_TOLERANCE, level_local_rows, rows_utilization
from odb_lightning.core.patch_budget import PatchBudget
from odb_lightning.core.sync import group_cost
from odb_lightning.core.types import Group, SampleInfo


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """The pooled round, identical on every rank.

    Attributes:
        rank_groups: Per rank, its group at each step position (``None``: IDLE).
        global_samples: Per step position, samples over all ranks.
        global_loss_tokens: Per step position, supervised tokens over all ranks.
        max_costs: Per step position, the costliest rank's cost (rounded up).
        cost_sums: Per step position, the ranks' costs summed.
        owners: The rank that offered each sample, by position in the epoch's order.
        left: Per rank, the samples it offered that no step of the round runs (a ramp
            round's pool runs only its costliest groups); they stay in its window.
    """

    rank_groups: tuple[tuple[Group | None, ...], ...]
    global_samples: tuple[int, ...]
    global_loss_tokens: tuple[int, ...]
    max_costs: tuple[int, ...]
    cost_sums: tuple[int, ...]
    owners: dict[int, int]
    left: tuple[tuple[SampleInfo, ...], ...] = ()

    @property
    def steps(self) -> int:
        return len(self.global_samples)

    def runners(self) -> dict[int, int]:
        """The rank that runs each sample of the round's steps, by position."""
        return {
            s.position: rank
            for rank, groups in enumerate(self.rank_groups)
            for g in groups
            if g is not None
            for s in g.samples
        }

    def moved(self, rank: int) -> tuple[list[SampleInfo], list[SampleInfo]]:
        """``(received, given)``: the samples ``rank`` runs but did not offer, and those
        it offered that another rank runs."""
        received = [
            s
            for g in self.rank_groups[rank]
            if g is not None
            for s in g.samples
            if self.owners[s.position] != rank
        ]
        given = [
            s
            for other, groups in enumerate(self.rank_groups)
            if other != rank
            for g in groups
            if g is not None
            for s in g.samples
            if self.owners[s.position] == rank
        ]
        return received, given


def _cost(group: Group, budget: Budget) -> int:
    return math.ceil(group_cost(group, budget))


def _assign(chunk: list[Group], owners: dict[int, int], world: int) -> list[Group | None]:
    """One step position: each rank one group of ``chunk`` (or IDLE), each group to the
    rank that holds most of its samples where it can (fewest moves; ties: lowest group
    index, then lowest rank)."""
    pairs = []
    for index, group in enumerate(chunk):
        held = Counter(owners[sample.position] for sample in group.samples)
        pairs.extend((-count, index, rank) for rank, count in held.items())
    pairs.sort()
    row: list[Group | None] = [None] * world
    placed: set[int] = set()
    for _, index, rank in pairs:
        if index not in placed and row[rank] is None:
            row[rank] = chunk[index]
            placed.add(index)
    free = iter(rank for rank in range(world) if row[rank] is None)
    for index, group in enumerate(chunk):
        if index not in placed:
            row[next(free)] = group
    return row


def _majority(group: Group, owners: dict[int, int]) -> int:
    held = Counter(owners[sample.position] for sample in group.samples)
    return min(held, key=lambda rank: (-held[rank], rank))


def _cost_ranked(groups: list[Group], owners: dict[int, int], budget: Budget) -> list[Group]:
    """The groups costliest first; groups of equal cost interleaved by the rank that holds
    most of each (its first such group, then every rank's second, ...), so a position of
    equal costs takes one group of each rank where it can and moves nothing."""
    keyed = []
    seen: dict[tuple[int, int], int] = {}
    for group in sorted(groups, key=lambda g: min(s.position for s in g.samples)):
        cost, owner = _cost(group, budget), _majority(group, owners)
        turn = seen.get((cost, owner), 0)
        seen[(cost, owner)] = turn + 1
        keyed.append(((-cost, turn, owner), group))
    keyed.sort(key=lambda pair: pair[0])
    return [group for _, group in keyed]


def _held_over_budget(ranked: list[Group], budget: Budget, world: int) -> list[Group]:
    """``ranked`` (in cost order) less its cheapest samples over the budget beyond a
    multiple of ``world`` (when at least ``world`` other groups remain), for a round that
    may leave samples where they are. Each runs alone at a cost above every group under
    the budget, so a step position mixing the two holds most ranks to the time of a few;
    the ones held back stay in their windows, and a later round pools them with those
    that arrive meanwhile (the epoch's last round runs whatever is left)."""
    over = [g for g in ranked if g.size == 1 and budget.is_over_budget(g.longest)]
    extra = len(over) % world
    if not extra or len(ranked) - extra < world:
        return ranked
    held = {id(g) for g in over[-extra:]}
    return [g for g in ranked if id(g) not in held]


def union_rows(
    offers: list[list[SampleInfo]],
    owners: dict[int, int],
    budget: Budget,
    *,
    patch_budget: PatchBudget | None = None,
    positions: int | None = None,
) -> list[list[Group | None]]:
    """The rows of ``offers`` grouped as one window (see :func:`plan_pool`): per step
    position, each rank's group (``None``: IDLE); ``positions`` ``0``: none."""
    world = len(offers)
    union = [s for offer in offers for s in offer]
    if not union or positions == 0:
        return []
    groups = group_window(union, budget, patch_budget=patch_budget)
    if positions is not None and len(groups) >= world:
        ranked = _held_over_budget(_cost_ranked(groups, owners, budget), budget, world)
        # Whole positions only: the cheapest groups beyond a multiple of W stay too.
        count = min(positions, len(ranked) // world)
        groups = ranked[: count * world]
    else:
        count = math.ceil(len(groups) / world)
        wanted = min(count * world, len(union))
        if wanted > len(groups):
            groups = split_groups(groups, wanted - len(groups))
        groups = _cost_ranked(groups, owners, budget)
    return [_assign(groups[t * world : (t + 1) * world], owners, world) for t in range(count)]


def plan_pool(
    offers: list[list[SampleInfo]],
    budget: Budget,
    *,
    patch_budget: PatchBudget | None = None,
    positions: int | None = None,
) -> PoolPlan:
    """Group the union of every rank's offered samples and hand the groups out.

    The union is grouped as one window (:func:`~odb_lightning.core.grouping.group_window`).
    With ``G`` groups over ``W`` ranks the round has ``P = ceil(G / W)`` step positions;
    singletons are peeled off the largest groups until there are ``P x W`` groups (or one
    per sample), which only lowers costs. The groups in cost order (costliest first; ties:
    the earliest position) fill the positions ``W`` at a time, and within a position each
    rank gets the group it holds most of (:func:`_assign`); the rest run IDLE.

    ``positions``: the most step positions (a ramp round's cap, a tail round's ``Q``, an
    uneven round's ``T``): a round that may leave samples where they are. It holds back
    the cheapest samples over the budget beyond a multiple of ``W`` and runs whole
    positions only, at most ``positions``: the costliest ``k x W`` groups; the samples of
    the others stay with the rank that offered them (``PoolPlan.left``).

    The local plan of the same round (:func:`~odb_lightning.core.locality.level_local_rows`:
    the positions of the ranks' own groups that are level already, the rest pooled as
    above) is taken instead when its utilization is within
    :data:`~odb_lightning.core.locality.LEVEL_TOLERANCE` of this one's: samples move only
    where moving them buys the level.
    """
    world = len(offers)
    owners = {s.position: rank for rank, offer in enumerate(offers) for s in offer}
    if len(owners) != sum(map(len, offers)):
        raise ValueError("two ranks offered the same position of the epoch's order")
    if positions is not None and positions < 1:
        raise ValueError(f"a pooled round runs at least one step position, got {positions}")
    rows = union_rows(offers, owners, budget, patch_budget=patch_budget, positions=positions)
    kept, residue = level_local_rows(offers, budget, patch_budget=patch_budget, positions=positions)
    if kept:
        left = None if positions is None else positions - len(kept)
        rest = union_rows(residue, owners, budget, patch_budget=patch_budget, positions=left)
        # Costliest positions first, as the union's.
        local = sorted(kept + rest, key=lambda row: -max(_cost(g, budget) for g in row if g))
        if rows_utilization(local, budget) >= rows_utilization(rows, budget) - LEVEL_TOLERANCE:
            rows = local
    columns = [[_cost(g, budget) if g is not None else 0 for g in row] for row in rows]
    running = {s.position for row in rows for g in row if g is not None for s in g.samples}
    return PoolPlan(
        rank_groups=tuple(tuple(row[r] for row in rows) for r in range(world)),
        global_samples=tuple(sum(g.size for g in row if g is not None) for row in rows),
        global_loss_tokens=tuple(
            sum(g.num_loss_tokens for g in row if g is not None) for row in rows
        ),
        max_costs=tuple(max(c) for c in columns),
        cost_sums=tuple(sum(c) for c in columns),
        owners=owners,
        left=tuple(tuple(s for s in offer if s.position not in running) for offer in offers),
    )
