"""How well the ranks of a synchronous data-parallel job keep each other busy.

In synchronous data parallelism a step takes as long as its slowest rank. With the cost
model of the budget (:class:`~odb_lightning.core.budget.Budget`: a padded group of ``g``
samples with longest ``L`` costs ``g x row_cost(L)``, one padding-free row its own cost
(:meth:`~odb_lightning.core.budget.Budget.group_cost`); an IDLE step 0), step position
``t`` costs every rank ``M_t = max_r c_{r,t}``:

* **sync efficiency** of a step: ``mean_r c_{r,t} / M_t``, the share of the step the
  ranks spend computing rather than waiting for the slowest one; the figure is the mean
  over the steps that hold any sample;
* **utilization**: ``sum of every sample's own cost / (W x sum_t M_t)``: useful work over
  what the ranks pay for (real tokens over ``W x`` the sum of the per-step maxima when
  ``attention_weight`` is 0). It multiplies the padding loss inside a group, the waiting
  across ranks and the IDLE steps, and is 1 only when every rank computes unpadded,
  equally costly groups at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.budget import Budget
from odb_lightning.core.types import Group


def group_cost(group: Group | None, budget: Budget) -> float:
    """The budget's cost of one step's group (``None``: an IDLE step, cost 0)."""
    if group is None:
        return 0.0
    return budget.group_cost([s.length for s in group.samples])


def useful_cost(group: Group | None, budget: Budget) -> float:
    """The cost of the group's samples each on its own, without padding."""
    if group is None:
        return 0.0
    return sum(budget.row_cost(s.length) for s in group.samples)


@dataclass(frozen=True, slots=True)
class SyncFigures:
    """Sync efficiency and utilization of one epoch (see the module docstring).

    Attributes:
        world_size: Ranks ``W``.
        steps: Steps per rank (equal on every rank).
        sync_efficiency: Mean over non-empty steps of ``mean_r c_{r,t} / max_r c_{r,t}``.
        utilization: Useful cost over ``W x sum_t max_r c_{r,t}``.
        idle_fraction: IDLE steps over all ``W x steps`` steps.
        max_cost_sum: ``sum_t max_r c_{r,t}``, what each rank pays in cost units.
        useful_cost_sum: The samples' own cost over every rank.
    """

    world_size: int
    steps: int
    sync_efficiency: float
    utilization: float
    idle_fraction: float
    max_cost_sum: float
    useful_cost_sum: float


def sync_figures(rank_groups: Sequence[Sequence[Group | None]], budget: Budget) -> SyncFigures:
    """Figures of per-rank step sequences (``None`` for IDLE), paired by position.

    Raises:
        ValueError: If the ranks hold different numbers of steps.
    """
    counts = {len(steps) for steps in rank_groups}
    if len(counts) > 1:
        raise ValueError(f"ranks hold different step counts {sorted(counts)}")
    world = len(rank_groups)
    steps = counts.pop() if counts else 0
    ratios: list[float] = []
    max_sum = 0.0
    for column in zip(*rank_groups, strict=True):
        costs = [group_cost(g, budget) for g in column]
        top = max(costs)
        max_sum += top
        if top > 0:
            ratios.append(sum(costs) / (world * top))
    useful = sum(useful_cost(g, budget) for steps_ in rank_groups for g in steps_)
    idle = sum(g is None for steps_ in rank_groups for g in steps_)
    return SyncFigures(
        world_size=world,
        steps=steps,
        sync_efficiency=sum(ratios) / len(ratios) if ratios else 1.0,
        utilization=useful / (world * max_sum) if max_sum > 0 else 1.0,
        idle_fraction=idle / (world * steps) if steps else 0.0,
        max_cost_sum=max_sum,
        useful_cost_sum=useful,
    )
