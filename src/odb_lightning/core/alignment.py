"""The DGAP (Distributed Group Alignment Problem) rule: one pure function of all ranks'
reports.

Every rank calls :func:`plan_round` on the same gathered reports, so every rank computes
the same :class:`RoundPlan` and acts on its own row: prediction and action are one call.

Max-based, bidirectional alignment:

* A rank that failed publishes ``aborted``; every rank then raises
  :class:`PeerFailedError` instead of finishing the epoch cleanly.
* The round ends the epoch when every rank is finished (join) or any rank is finished
  (non-join; windows are then dropped and counted by their owners).
* If any rank has no free output slot, the round emits nothing (``skipped``).
* Otherwise ``T = max(G_r over unfinished ranks)``, capped by the smallest free-slot count
  and by the smallest positive buffered-sample count, and at least 1.
* A rank with fewer than ``T`` groups splits: it peels the shortest sample off its
  largest multi-sample group (ties: earliest group) into a new singleton, ``T - G_r``
  times. ``T <= S_r`` guarantees enough samples. Peeling the shortest member keeps the
  group's longest sample, so its padded cost can only fall.
* A rank with more than ``T`` groups overflows: it keeps its first ``T`` groups (in its
  own priority order) and returns the rest to its window.
* Finished ranks fill all ``T`` positions with IDLE steps.
* Dealing by need (``shard_dealing=by_need``): the epoch has one seeded global order and
  no fixed shards. Every round deals the next undealt samples of it, in rank order, each
  rank as many as it asked for within a cap that levels the ranks' work
  (:mod:`~odb_lightning.core.dealing`), so every sample goes to exactly one rank, a rank
  that emitted heavy samples is topped up with more, and the ranks end the epoch with
  equal work. A round in
  which an unfinished rank's window is not yet full only deals (``T = 0``).
* Cost-aligned steps: each rank's ``T`` steps are put in :func:`cost_order` (costliest
  first), so step position ``t`` pairs the ``t``-th costliest step of every rank. A step
  takes as long as its slowest rank; pairing steps by rank of cost makes the per-step
  maxima as small as any pairing can (for sorted sequences the sum of position-wise maxima
  is minimal). Costs come from the reports, so every rank computes every rank's order.
* Grouping across ranks (``cross_rank_grouping``) is decided over this rule's plan: an
  emitting round of the epoch's tail, of the ramp, or whose aligned steps are uneven
  groups the union of the windows instead (:mod:`~odb_lightning.core.pooling`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from odb_lightning.core.budget import Budget
from odb_lightning.core.dealing import deal_caps, deal_counts, ready
from odb_lightning.core.ramp import EpochLeft
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.wire import RankReport


class AlignmentError(RuntimeError):
    """Ranks are out of step (different epoch or round) or sent inconsistent reports."""


class PeerFailedError(RuntimeError):
    """Another rank reported a failure; this rank must stop too."""


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """The outcome of one round, identical on every rank.

    Attributes:
        target_steps: ``T``, the steps every rank emits this round (0 if none).
        skipped: Some rank had no free output slot; nothing is emitted.
        epoch_over: The epoch ends with this round; nothing is emitted.
        rank_sizes: Per rank, the samples of each of its ``T`` steps (0 = IDLE).
        rank_loss_tokens: Per rank, the supervised tokens of each of its ``T`` steps.
        rank_costs: Per rank, the cost of each of its ``T`` steps (IDLE: 0).
        rank_orders: Per rank, which of its aligned steps (kept groups, then the peeled
            singletons) goes to each step position.
        deals: Per rank, how many samples of the global order it is dealt this round
            (after those dealt to the ranks before it).
        global_samples: Per step position, samples over all ranks.
        global_loss_tokens: Per step position, supervised tokens over all ranks.
        left: What is left of the epoch as the round starts, in a round that deals or
            emits (the window ramp reads it where the epoch is dealt by need:
            :func:`~odb_lightning.core.ramp.ramp_ends`).
    """

    target_steps: int
    skipped: bool = False
    epoch_over: bool = False
    rank_sizes: tuple[tuple[int, ...], ...] = ()
    rank_loss_tokens: tuple[tuple[int, ...], ...] = ()
    rank_costs: tuple[tuple[int, ...], ...] = ()
    rank_orders: tuple[tuple[int, ...], ...] = ()
    deals: tuple[int, ...] = ()
    global_samples: tuple[int, ...] = ()
    global_loss_tokens: tuple[int, ...] = ()
    left: EpochLeft | None = None


def peel_order(sizes: list[int], num_peels: int) -> list[int]:
    """Which group each successive peel takes a sample from: the largest group with more
    than one sample, the earliest on ties (new singletons are never peeled). A heap keyed
    by (size, index): each peel costs ``log(groups)``, so a round that peels most of its
    window stays linear in it.

    Raises:
        AlignmentError: If fewer than ``num_peels`` samples can be peeled.
    """
    peelable = [(-size, index) for index, size in enumerate(sizes) if size > 1]
    heapq.heapify(peelable)
    order: list[int] = []
    for _ in range(num_peels):
        if not peelable:
            raise AlignmentError(f"cannot split groups of sizes {sizes} {num_peels} times")
        negative_size, index = heapq.heappop(peelable)
        order.append(index)
        if -negative_size > 2:  # still more than one sample once this one is peeled
            heapq.heappush(peelable, (negative_size + 1, index))
    return order


def split_groups(groups: list[Group], num_peels: int) -> list[Group]:
    """Apply ``num_peels`` peels (see :func:`alignment.peel_order`) to real groups:
    each peel moves the shortest member of the chosen group into a new singleton."""
    members = [list(g.samples) for g in groups]
    for index in peel_order([len(m) for m in members], num_peels):
        members.append([members[index].pop()])
    return [Group(tuple(m)) for m in members]


def peel_figures(groups: list[Group], num_peels: int, budget: Budget) -> list[tuple[int, int, int]]:
    """Per peel of :func:`split_groups`, in order: the peeled sample's supervised tokens,
    the cost of its singleton and how much the cost of the group it leaves falls (costs
    rounded up to integers, so the falls add up to the rounded cost of what is left). A
    rank's report carries them, so every rank replays its split (:func:`aligned_steps`).

    A peel takes a group's last (shortest) sample, so what is left is always a prefix of
    the group: each peeled group's prefix figures are summed once, and a peel costs the
    same whatever the group's size."""
    left = [g.size for g in groups]
    prefixes: dict[int, list[int]] = {}
    figures = []
    for index in peel_order(list(left), num_peels):
        if index not in prefixes:
            prefixes[index] = _prefix_costs(groups[index], budget)
        size = left[index]
        left[index] = size - 1
        peeled = groups[index].samples[size - 1]
        costs = prefixes[index]
        figures.append(
            (peeled.num_loss_tokens, _single_cost(peeled, budget), costs[size] - costs[size - 1])
        )
    return figures


def _prefix_costs(group: Group, budget: Budget) -> list[int]:
    """Rounded cost of the group's first ``k`` samples, for ``k`` in ``0..size``."""
    costs, longest, total, squares = [0], 0, 0, 0
    for count, sample in enumerate(group.samples, start=1):
        longest = max(longest, sample.length)
        total += sample.length
        squares += sample.length * sample.length
        costs.append(math.ceil(budget.aggregate_cost(count, longest, total, squares)))
    return costs


def _single_cost(sample: SampleInfo, budget: Budget) -> int:
    length = sample.length
    return math.ceil(budget.aggregate_cost(1, length, length, length * length))


def _column(values: tuple[int, ...], count: int) -> list[int]:
    # A report may leave the costs out (all 0: the order stays the report's).
    return list(values[:count]) if values else [0] * count


def aligned_steps(report: RankReport, target: int) -> tuple[list[int], list[int], list[int]]:
    """Sizes, supervised tokens and costs of a rank's ``target`` steps after
    split/overflow: the kept groups in report order, then the peeled singletons."""
    if report.finished or report.buffered == 0:
        return [0] * target, [0] * target, [0] * target
    sizes = list(report.group_sizes[:target])
    losses = list(report.group_loss_tokens[:target])
    costs = _column(report.group_costs, len(sizes))
    num_peels = target - len(sizes)
    if num_peels > len(report.peel_loss_tokens):
        raise AlignmentError(
            f"a rank needs {num_peels} peels but published {len(report.peel_loss_tokens)}"
        )
    peels = zip(
        peel_order(sizes, num_peels),
        report.peel_loss_tokens,
        _column(report.peel_costs, num_peels),
        _column(report.peel_savings, num_peels),
        strict=False,
    )
    for group, peeled_loss, peeled_cost, saving in peels:
        sizes[group] -= 1
        losses[group] -= peeled_loss
        costs[group] -= saving
        sizes.append(1)
        losses.append(peeled_loss)
        costs.append(peeled_cost)
    return sizes, losses, costs


def cost_order(costs: list[int]) -> list[int]:
    """Step indices costliest first; ties keep the aligned order (deterministic)."""
    return sorted(range(len(costs)), key=lambda i: (-costs[i], i))


def _check_in_step(reports: list[RankReport]) -> None:
    first = reports[0]
    for rank, report in enumerate(reports):
        if (report.epoch, report.round_index) != (first.epoch, first.round_index):
            raise AlignmentError(
                f"rank {rank} is at epoch {report.epoch} round {report.round_index}, "
                f"rank 0 at epoch {first.epoch} round {first.round_index}"
            )
        if report.undealt != first.undealt:
            raise AlignmentError(
                f"rank {rank} sees {report.undealt} undealt samples, rank 0 {first.undealt}"
            )


def target_steps(reports: list[RankReport]) -> int:
    """``T`` for a round that emits (no rank finished-only, every rank has a free slot)."""
    active = [r for r in reports if not r.finished]
    target = max(r.num_groups for r in active)
    target = min(target, min(r.free_slots for r in reports))
    positive_buffers = [r.buffered for r in active if r.buffered > 0]
    if positive_buffers:
        target = min(target, min(positive_buffers))
    return max(1, target)


def plan_round(
    reports: list[RankReport],
    *,
    join: bool,
    fetch_aware: bool = False,
) -> RoundPlan:
    """The DGAP rule (see the module docstring) over all ranks' reports.

    ``fetch_aware``: dealing sees fetch time (:mod:`~odb_lightning.core.dealing`)."""
    if not reports:
        raise AlignmentError("a round needs at least one report")
    failed = [rank for rank, r in enumerate(reports) if r.aborted]
    if failed:
        raise PeerFailedError(f"rank(s) {failed} failed and aborted the epoch; see their errors")
    _check_in_step(reports)
    finished = [r.finished for r in reports]
    if all(finished) or (not join and any(finished)):
        return RoundPlan(target_steps=0, epoch_over=True)
    if any(r.free_slots <= 0 for r in reports):
        return RoundPlan(target_steps=0, skipped=True)
    caps = deal_caps(reports, fetch_aware=fetch_aware)  # once: both read them
    deals = deal_counts(reports, fetch_aware=fetch_aware, caps=caps)
    if not ready(reports, fetch_aware=fetch_aware, caps=caps):
        return RoundPlan(target_steps=0, deals=deals, left=EpochLeft.of(reports))
    target = target_steps(reports)
    orders, sizes, losses, costs = [], [], [], []
    for report in reports:
        row_sizes, row_losses, row_costs = aligned_steps(report, target)
        order = cost_order(row_costs)
        orders.append(tuple(order))
        sizes.append(tuple(row_sizes[i] for i in order))
        losses.append(tuple(row_losses[i] for i in order))
        costs.append(tuple(row_costs[i] for i in order))
    return RoundPlan(
        target_steps=target,
        rank_sizes=tuple(sizes),
        rank_loss_tokens=tuple(losses),
        rank_costs=tuple(costs),
        rank_orders=tuple(orders),
        deals=deals,
        global_samples=tuple(map(sum, zip(*sizes, strict=True))),
        global_loss_tokens=tuple(map(sum, zip(*losses, strict=True))),
        left=EpochLeft.of(reports),
    )
