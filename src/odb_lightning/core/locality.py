"""Keeping a pooled round's samples on the rank that fetched them.

A pooled round (:func:`~odb_lightning.core.pool_plan.plan_pool`) that groups the union of
the windows as one window mixes every rank's samples in each group: most samples then run
on a rank that did not fetch them, and their bytes cross the wire. Most step positions do
not need that. :func:`level_local_rows` lets every rank group its own samples, lines the
groups up costliest first (each rank's ``t``-th costliest at position ``t``, the ordinary
round's alignment) and keeps the positions that are level already: those whose samples'
own cost is at least :data:`KEEP_LEVEL` of ``W`` times the position's costliest group
(padding and waiting together). Only the samples of the other positions are pooled and
grouped as one window (:func:`~odb_lightning.core.pool_plan.union_rows`), so they move.

:func:`~odb_lightning.core.pool_plan.plan_pool` takes that plan unless it costs the ranks
more than :data:`LEVEL_TOLERANCE` of the union's utilization: a sample moves where moving
buys the level.
"""

from __future__ import annotations

from odb_lightning.core.budget import Budget
from odb_lightning.core.grouping import group_window
from odb_lightning.core.patch_budget import PatchBudget
from odb_lightning.core.sync import group_cost, useful_cost
from odb_lightning.core.types import Group, SampleInfo

KEEP_LEVEL = 0.99
"""A position of the ranks' own groups is kept where its samples' own cost is at least
this share of ``W x`` its costliest group; the samples of the others are pooled."""
LEVEL_TOLERANCE = 0.004
"""Most utilization (useful cost over ``W x`` the positions' costliest groups) the local
plan of a pooled round may give up against grouping the whole union; beyond it the round
groups the union."""

Rows = list[list[Group | None]]
"""Per step position, each rank's group (``None``: IDLE)."""


def rows_utilization(rows: Rows, budget: Budget) -> float:
    """Useful cost of the rows' samples over ``W x`` the sum of each position's costliest
    group (1.0 for no rows)."""
    paid = sum(max(group_cost(g, budget) for g in row) for row in rows)
    useful = sum(useful_cost(g, budget) for row in rows for g in row)
    return useful / (len(rows[0]) * paid) if paid else 1.0


def level_local_rows(
    offers: list[list[SampleInfo]],
    budget: Budget,
    *,
    patch_budget: PatchBudget | None = None,
    positions: int | None = None,
) -> tuple[Rows, list[list[SampleInfo]]]:
    """The level positions of the ranks' own groups (see the module docstring), at most
    ``positions`` of them, and per rank the samples they leave (to pool)."""
    world = len(offers)
    ranked = [
        sorted(
            group_window(offer, budget, patch_budget=patch_budget),
            key=lambda g: (-group_cost(g, budget), g.age),
        )
        for offer in offers
    ]
    kept: Rows = []
    for row in zip(*ranked, strict=False):
        if positions is not None and len(kept) == positions:
            break
        paid = world * max(group_cost(g, budget) for g in row)
        if sum(useful_cost(g, budget) for g in row) >= KEEP_LEVEL * paid:
            kept.append(list(row))
    running = {s.position for row in kept for g in row if g is not None for s in g.samples}
    residue = [[s for s in offer if s.position not in running] for offer in offers]
    return kept, residue
