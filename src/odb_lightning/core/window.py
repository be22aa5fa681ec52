"""The per-rank grouping window: a state machine driven by one alignment round at a time.

Life of a sample: the window asks for it (:meth:`GroupingWindow.request`), the input
pipeline delivers it (:meth:`GroupingWindow.add`), it waits in the window until a round
emits it in a step. A round starts only when every requested sample has arrived and the
window is full (or the shard is fully requested; :mod:`~odb_lightning.core.window_fill`),
so the same seed gives the same steps, in production and in
:mod:`odb_lightning.core.simulate`.

The ramp (``ramp_budgets``, :mod:`~odb_lightning.core.ramp`): the window is full at a
few budgets of work in the epoch's first emitting rounds, growing to the full window, and
each ramp round emits only a few steps, keeping the rest of its samples for the next
round. Every rank counts the same emitting rounds (every rank acts on the same plans), so
every rank ramps in step, and what a round sees stays a function of the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from odb_lightning.core.alignment import (
    AlignmentError,
    RoundPlan,
    peel_figures,
    plan_round,
    split_groups,
)
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.online_policy import EmissionOrder
from odb_lightning.core.order import emission_order, make_rng
from odb_lightning.core.pool_plan import PoolPlan
from odb_lightning.core.pooling import PooledRound
from odb_lightning.core.ramp import EpochLeft, ramp_ends, ramp_step_cap, ramp_targets
from odb_lightning.core.sync import group_cost, useful_cost
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.window_fill import WindowFill
from odb_lightning.core.wire import RankReport, decode_report, encode_report

Exchange = Callable[[list[int]], list[list[int]]]
"""All-gather of one fixed-size integer message: returns every rank's message by rank."""


@dataclass(frozen=True, slots=True)
class Step:
    """One emitted step: a local group (``None`` for IDLE) and the step's global counts.

    ``max_cost`` and ``cost_sum`` are the step's cost (the budget's cost model, rounded up)
    on the slowest rank and over all ranks, from the round's plan; ``useful_cost`` is the
    cost of this rank's samples each on its own (:mod:`odb_lightning.core.sync`).
    """

    group: Group | None
    global_samples: int
    global_loss_tokens: int
    round_index: int
    index_in_round: int
    max_cost: int = 0
    cost_sum: int = 0
    useful_cost: int = 0

    @property
    def is_idle(self) -> bool:
        return self.group is None


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """What one round did on this rank.

    Attributes:
        steps: Steps to emit, in order (``T`` of them; none if the round only dealt or
            ended the epoch).
        epoch_over: No more rounds this epoch.
        dropped: Samples of this rank's shard never emitted (non-join end of epoch).
        pooled: The round grouped across ranks; every rank then moves samples.
        moved_in: Positions (in the epoch's order) of the samples this rank runs but
            another rank holds; ``moved_out``: those it holds and another rank runs;
            ``moved_to``: the rank that runs each of ``moved_out``.
    """

    steps: tuple[Step, ...] = ()
    epoch_over: bool = False
    dropped: int = 0
    pooled: bool = False
    moved_in: tuple[int, ...] = ()
    moved_out: tuple[int, ...] = ()
    moved_to: tuple[int, ...] = ()


class GroupingWindow(WindowFill):
    """One rank's window for one epoch: it fills as a
    :class:`~odb_lightning.core.window_fill.WindowFill`, and each round it reports its
    groups (:meth:`make_report`) and acts on the plan: an ordinary round's (:meth:`apply`)
    or its row of a pooled round's (:meth:`apply_pool`).

    Args:
        config: Job-wide batching settings (identical on every rank).
        shard_size: Samples in this rank's shard (dealt by need: in the global order).
        rank: This rank's index in the reports (to check its row of the plan).
        epoch: Epoch number (part of every report and of the step-order seed).
    """

    def __init__(
        self, config: BatchingConfig, shard_size: int, *, rank: int = 0, epoch: int = 0
    ) -> None:
        super().__init__(config, shard_size, rank=rank)
        self._ramp.extend(ramp_targets(self.policy))
        self.epoch = epoch
        # Rounds of this epoch that grouped across ranks (every rank's count is the same).
        self.num_pooled_rounds = 0
        self._groups: list[Group] | None = None  # this round's, from make_report
        self.round_index = 0
        self.num_dropped = 0
        self.epoch_over = False
        # Set by the runtime before each report (``fetch_aware_dealing``): microseconds
        # waited this epoch for this rank's own samples, and since the epoch started.
        self.wait_us = 0
        self.elapsed_us = 0

    def make_report(self) -> RankReport:
        """Group the window and describe it for the exchange (see :mod:`wire`).

        Its ``free_slots`` is the round's step cap (:meth:`round_step_cap`:
        ``max_steps_per_round``, less while the ramp runs): back-pressure is per batch in
        the runtime (a step takes an output slot when it is collated), so what a round
        sees never depends on how fast the consumer is."""
        if not self.is_ready():
            raise RuntimeError("the window is not ready: samples are still in flight")
        max_steps = self.round_step_cap()
        wanted = self.wanted()
        full = wanted == 0
        # A window that is not full only asks for samples: the round emits nothing
        # (dealing by fetch time, it may emit if it is at its share: dealing.ready).
        groups = self._grouped() if full or self.policy.deals_by_fetch_time else []
        self._groups = groups
        shown = groups[:max_steps]
        num_peels = max(0, min(len(self._buffer), max_steps) - len(groups)) if full else 0
        peels = peel_figures(groups, num_peels, self._budget)
        return RankReport(
            epoch=self.epoch,
            round_index=self.round_index,
            aborted=False,
            finished=self.is_finished(),
            free_slots=max_steps,
            buffered=len(self._buffer),
            num_groups=min(len(groups), max_steps),
            group_sizes=tuple(g.size for g in shown),
            group_loss_tokens=tuple(g.num_loss_tokens for g in shown),
            peel_loss_tokens=tuple(loss for loss, _, _ in peels),
            group_costs=tuple(math.ceil(group_cost(g, self._budget)) for g in shown),
            peel_costs=tuple(cost for _, cost, _ in peels),
            peel_savings=tuple(saving for _, _, saving in peels),
            undealt=self._undealt,
            wanted=wanted,
            full=full,
            dealt_cost=self.dealt_cost,
            dealt_samples=self.dealt_samples,
            wait_us=self.wait_us,
            elapsed_us=self.elapsed_us,
        )

    def round_step_cap(self) -> int:
        """The most steps this round may emit: ``max_steps_per_round``, and while the
        ramp lasts :func:`ramp_step_cap` (a share of its target; where rounds group
        across ranks, the last ramp round's steps cover the full window's refill: once
        a round of the epoch has pooled, as the ramp's first rounds do)."""
        cap = self.policy.max_steps_per_round
        if self._ramp:
            pooled = self.num_pooled_rounds > 0
            cap = min(cap, ramp_step_cap(self.policy, self._ramp, pooled=pooled))
        return cap

    def make_abort_report(self) -> RankReport:
        """The report a failing rank publishes so that its peers raise, not hang."""
        return RankReport(
            epoch=self.epoch,
            round_index=self.round_index,
            aborted=True,
            finished=False,
            free_slots=0,
            buffered=0,
            num_groups=0,
        )

    def apply(self, plan: RoundPlan) -> RoundOutcome:
        """Act on this rank's row of the round plan."""
        if self._groups is None:
            raise RuntimeError("apply() needs make_report() first in every round")
        groups, self._groups = self._groups, None
        if plan.epoch_over:
            return self._end_epoch()
        self.round_index += 1
        self._receive_deal(plan.deals)
        if plan.target_steps == 0:
            self._end_ramp_if_small(plan.left, 0)
            return RoundOutcome()
        local = self._local_steps(groups, plan)
        columns = list(zip(*plan.rank_costs, strict=True))
        costs = [(max(column), sum(column)) for column in columns]
        return RoundOutcome(
            steps=self._emit(local, plan.global_samples, plan.global_loss_tokens, costs, plan.left)
        )

    def _emit(
        self,
        local: list[Group | None] | tuple[Group | None, ...],
        global_samples: tuple[int, ...],
        global_loss_tokens: tuple[int, ...],
        costs: list[tuple[int, int]],
        left: EpochLeft | None,
    ) -> tuple[Step, ...]:
        """An emitting round's steps in the emission order (``costs``: per position, the
        slowest rank's cost and the ranks' sum); the ramp moves on to its next target, or
        ends where what is left of an epoch dealt by need is small or fits that target's
        window (``left``: what was left as the round started; :func:`~.ramp.ramp_ends`)."""
        if self._ramp:
            self._ramp.popleft()
            self._end_ramp_if_small(left, sum(global_samples))
        # Supervised tokens per sample at each position, over every rank: the same on
        # every rank, and long where the samples are (what ``paired`` pairs by).
        lengths = [
            t / n if n else 0.0 for t, n in zip(global_loss_tokens, global_samples, strict=True)
        ]
        order = emission_order(
            len(local),
            make_rng(self.config.seed, "round", self.epoch, self.round_index - 1),
            paired=self.policy.emission_order is EmissionOrder.PAIRED,
            lengths=lengths,
        )
        return tuple(
            Step(
                group=local[i],
                global_samples=global_samples[i],
                global_loss_tokens=global_loss_tokens[i],
                round_index=self.round_index - 1,
                index_in_round=k,
                max_cost=costs[i][0],
                cost_sum=costs[i][1],
                useful_cost=math.ceil(useful_cost(local[i], self._budget)),
            )
            for k, i in enumerate(order)
        )

    def _end_ramp_if_small(self, left: EpochLeft | None, emitted: int) -> None:
        """End the ramp where what is left of an epoch dealt by need is small or fits the
        window it fills to (``left``: as the round started; ``emitted``: the samples the
        round ran; :func:`~.ramp.ramp_ends`): the window then fills to the rest of the epoch and
        the next emitting round groups it all. Every rank sees the same ``left``, so
        every rank ends its ramp in the same round."""
        if (
            self._ramp
            and self.by_need
            and left is not None
            and ramp_ends(self.policy, self._ramp, left, emitted, self._budget.token_budget)
        ):
            self._ramp.clear()

    def pool_offer(self) -> list[SampleInfo]:
        """This window's samples, offered to a pooled round, in position order (so the
        pooled plan does not depend on the order they arrived in)."""
        if self._groups is None:
            raise RuntimeError("pool_offer() needs make_report() first in every round")
        return sorted(self._buffer, key=lambda s: s.position)

    def apply_pool(self, pool: PooledRound, plan: PoolPlan) -> RoundOutcome:
        """Act on this rank's row of a pooled round (:meth:`PooledRound.share`): run its
        groups, give away the samples another rank runs, keep those no step runs."""
        if self._groups is None:
            raise RuntimeError("apply_pool() needs make_report() first in every round")
        self._groups = None
        self.round_index += 1
        self.num_pooled_rounds += 1
        share = pool.share(plan, self.rank, self._buffer)
        self._move(share.received, share.given)
        self._hold(list(share.left))
        self._count_emitted([g for g in share.groups if g is not None])
        costs = list(zip(plan.max_costs, plan.cost_sums, strict=True))
        return RoundOutcome(
            steps=self._emit(
                share.groups, plan.global_samples, plan.global_loss_tokens, costs, pool.left
            ),
            pooled=True,
            moved_in=tuple(s.position for s in share.received),
            moved_out=tuple(s.position for s in share.given),
            moved_to=share.given_to,
        )

    def _local_steps(self, groups: list[Group], plan: RoundPlan) -> list[Group | None]:
        target = plan.target_steps
        if self.is_finished() or not self._buffer:  # empty: at its share (fetch_aware)
            local: list[Group | None] = [None] * target
        else:
            kept = (
                groups[:target]
                if len(groups) >= target
                else split_groups(groups, target - len(groups))
            )
            local = [kept[i] for i in plan.rank_orders[self.rank]]
            emitted = {s.position for g in kept for s in g.samples}
            self._hold([s for s in self._buffer if s.position not in emitted])
            self._count_emitted(kept)
        sizes = tuple(0 if g is None else g.size for g in local)
        if sizes != plan.rank_sizes[self.rank]:
            raise AlignmentError(
                f"rank {self.rank} formed steps of sizes {sizes}, the plan says "
                f"{plan.rank_sizes[self.rank]}"
            )
        return local

    def _end_epoch(self) -> RoundOutcome:
        self.epoch_over = True
        held = self.num_dealt + self.num_moved_in - self.num_moved_out
        self.num_dropped = held - self.num_emitted - self.num_skipped
        self._hold([])
        return RoundOutcome(epoch_over=True, dropped=self.num_dropped)


def exchange_round(window: GroupingWindow, exchange: Exchange) -> RoundOutcome:
    """One round as the runtime runs it: report, all-gather, plan, act. A pooled round
    (:class:`~odb_lightning.core.pooling.PooledRound`) all-gathers the windows' offers
    too, and its outcome names the samples that move (``moved_in``, ``moved_out``)."""
    max_steps = window.policy.max_steps_per_round
    message = encode_report(window.make_report(), max_steps)
    reports = [decode_report(m, max_steps) for m in exchange(message)]
    plan = plan_round(
        reports, join=window.policy.join, fetch_aware=window.policy.deals_by_fetch_time
    )
    pool = PooledRound.of(reports, plan, window.config)
    if pool is None:
        return window.apply(plan)
    return window.apply_pool(pool, pool.plan(pool.gather(window.pool_offer(), exchange)))
