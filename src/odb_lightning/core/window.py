"""The per-rank grouping window: a state machine driven by one alignment round at a time.

Life of a sample: the window asks for it (:meth:`GroupingWindow.request`), the input
pipeline delivers it (:meth:`GroupingWindow.add`), it waits in the window until a round
emits it in a step. A round starts only when every requested sample has arrived and the
window is full (or the shard is fully requested), so what a round sees does not depend on
how fast workers were: the same seed gives the same steps, in production and in
:mod:`odb_lightning.core.simulate`.

The ramp (``ramp_budgets``): a window is full at ``ramp_budgets`` budgets of work in the
epoch's first emitting round, :data:`RAMP_GROWTH` times that in the next, and so on up to
the full window, and each ramp round emits only a few steps (:data:`RAMP_STEP_SHARE`),
keeping the rest of its samples for the next round. Every rank counts the same emitting
rounds (every rank acts on the same plans), so every rank ramps in step, and what a round
sees stays a function of the data.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from odb_lightning.core.alignment import (
    AlignmentError,
    RoundPlan,
    peel_order,
    plan_round,
    split_groups,
)
from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import group_window
from odb_lightning.core.online_policy import EmissionOrder, OnlinePolicy
from odb_lightning.core.order import emission_order, make_rng
from odb_lightning.core.pooling import PoolPlan, decode_offer, encode_offer, plan_pool
from odb_lightning.core.sync import group_cost, useful_cost
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.wire import RankReport, decode_report, encode_report

RAMP_GROWTH = 4
"""How much the ramp's window grows per emitting round. Each round's steps train while the
workers fetch the next, larger window, so the pipeline keeps up while fetching a budget
takes under a quarter of a step; every ramp round groups a small window, so fewer rounds
cost fewer steps (experiments/ramp measures 2, 4 and 8)."""


RAMP_STEP_SHARE: float | None = 0.125
"""The steps a ramp round may emit, per budget of its target (at least one): 1, 1 and 4
steps at 2, 8 and 32 budgets. A small window groups its samples poorly and, across ranks,
a round's ``T`` is its largest group count; emitting a few steps and keeping the rest in
the window to be grouped with the next arrivals costs the ramp 0-1 % of the epoch's steps
at 1 rank and 2-5 % at 8 against 0.3-27 % emitting every group (experiments/ramp).
``None``: a ramp round emits every group."""


def ramp_targets(policy: OnlinePolicy) -> tuple[int, ...]:
    """The budgets of work the window fills to in the epoch's first emitting rounds, one
    per round, before it fills to the full window (empty: no ramp). The ramp ends where it
    would reach the full window: ``window_budgets``, or for a window of ``D`` samples ``D``
    budgets (taking a sample to cost at most a budget)."""
    full = policy.window_budgets or policy.outstanding_depth
    targets: list[int] = []
    budgets = policy.ramp_budgets
    while budgets is not None and budgets < full:
        targets.append(budgets)
        budgets *= RAMP_GROWTH
    return tuple(targets)


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


def peel_figures(groups: list[Group], num_peels: int, budget: Budget) -> list[tuple[int, int, int]]:
    """Per peel of :func:`split_groups`, in order: the peeled sample's supervised tokens,
    the cost of its singleton and how much the cost of the group it leaves falls (costs
    rounded up to integers, so the falls add up to the rounded cost of what is left).

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


def _step_cost(group: Group, budget: Budget) -> int:
    return math.ceil(group_cost(group, budget))


class GroupingWindow:
    """One rank's window for one epoch.

    With fixed shards (``shard_dealing=fixed``) the window owns positions
    ``0..shard_size - 1`` of its shard. Dealt by need, ``shard_size`` is the length of the
    epoch's global order and the window owns the positions the rounds deal to it
    (:func:`~odb_lightning.core.dealing.deal_counts`).

    Args:
        config: Job-wide batching settings (identical on every rank).
        shard_size: Samples in this rank's shard (dealt by need: in the global order).
        rank: This rank's index in the reports (to check its row of the plan).
        epoch: Epoch number (part of every report and of the step-order seed).
    """

    def __init__(
        self, config: BatchingConfig, shard_size: int, *, rank: int = 0, epoch: int = 0
    ) -> None:
        if shard_size < 0:
            raise ValueError(f"shard_size must be >= 0, got {shard_size}")
        self.config = config
        self.policy: OnlinePolicy = config.policy  # type: ignore[assignment]
        self.shard_size = shard_size
        self.rank = rank
        self.epoch = epoch
        self.by_need = self.policy.by_need
        self._budget = config.budget
        self._buffer: list[SampleInfo] = []
        # Row costs rounded up to integers, so the sums do not depend on arrival order.
        self._buffered_cost = 0  # of the buffered samples
        self._received_cost = 0  # ... and of every sample received this epoch
        self._moved_cost = 0  # ... moved in less moved out (pooled rounds)
        self._buffered_bytes = 0  # serialized sizes, for window_max_mib
        self._received_bytes = 0
        self._undealt = shard_size if self.by_need else 0
        self._dealt: deque[range] = deque([] if self.by_need else [range(shard_size)])
        self.num_dealt = 0 if self.by_need else shard_size
        self._pending: set[int] = set()  # requested, not arrived
        self._num_received = 0
        self._groups: list[Group] | None = None
        # The last grouping of the buffer, reused while the buffer is unchanged (a full
        # window waits through rounds that only deal to other ranks).
        self._cached_groups: list[Group] = []
        self._buffer_changed = True
        self.round_index = 0
        self.num_emitted = 0
        self.num_over_budget = 0
        self.num_over_patch_budget = 0  # single samples over max_patches
        self.num_dropped = 0
        self.num_skipped = 0
        self.num_grouped = 0  # samples grouped over the epoch's rounds (the planner's work)
        self.num_moved_in = 0  # samples this rank ran that another rank offered
        self.num_moved_out = 0  # samples this rank offered that another rank ran
        self.moved_in_bytes = 0
        self.epoch_over = False
        self._ramp = deque(ramp_targets(self.policy))  # the targets of the rounds to come
        # Set by the runtime before each report (``fetch_aware_dealing``): microseconds
        # waited this epoch for this rank's own samples, and since the epoch started.
        self.wait_us = 0
        self.elapsed_us = 0

    # -- filling ---------------------------------------------------------------------
    @property
    def num_buffered(self) -> int:
        return len(self._buffer)

    @property
    def num_in_flight(self) -> int:
        return len(self._pending)

    @property
    def num_available(self) -> int:
        """Positions this rank owns and has not requested yet."""
        return sum(len(block) for block in self._dealt)

    @property
    def num_undealt(self) -> int:
        """Positions of the epoch's global order not dealt yet (0 with fixed shards)."""
        return self._undealt

    @property
    def num_buffered_bytes(self) -> int:
        """Serialized bytes of the samples in the window."""
        return self._buffered_bytes

    @property
    def num_received(self) -> int:
        """Samples that arrived (or were skipped) this epoch."""
        return self._num_received

    @property
    def received_cost(self) -> int:
        """Row costs of the samples that arrived this epoch, each rounded up."""
        return self._received_cost

    @property
    def target_budgets(self) -> int | None:
        """The token budgets of work the window fills to this round: the ramp's while it
        lasts, else ``window_budgets`` (``None``: the window is ``outstanding_depth``
        samples)."""
        return self._ramp[0] if self._ramp else self.policy.window_budgets

    @property
    def target_cost(self) -> float | None:
        """The work the window fills to: :attr:`target_budgets` token budgets."""
        budgets = self.target_budgets
        return None if budgets is None else budgets * self._budget.token_budget

    def shortfall(self) -> int:
        """How many more samples the window lacks (whether or not any are left).

        A window sized in work decides only when nothing is in flight, from the samples it
        holds: it lacks the missing work divided by the mean row cost of the samples seen
        this epoch (one sample a budget before any arrived), but no more than as many
        samples as it has seen (a mean of ``n`` samples is trusted for ``n`` more, so a
        small window, the ramp's, does not overshoot on the mean of its first few), and no
        more than the bytes left under ``window_max_mib`` hold at their mean size (at least
        one while any are left, so the cap may be passed by one sample). Each decision is a
        function of samples that arrived, never of how fast they did, so the window a round
        sees is the same in production and in the simulator.
        """
        room = self.policy.outstanding_depth - self.num_buffered - self.num_in_flight
        budgets = self.target_budgets
        if budgets is None or room <= 0:
            return max(0, room)
        target = budgets * self._budget.token_budget
        cap = self.policy.window_max_bytes
        over_bytes = cap is not None and self._buffered_bytes >= cap
        if self.num_in_flight or self._buffered_cost >= target or over_bytes:
            return 0
        seen = self._num_received - self.num_skipped
        if seen == 0:
            return min(room, budgets)
        missing = target - self._buffered_cost
        wanted = min(seen, max(1, math.ceil(missing * seen / self._received_cost)))
        if cap is not None and self._received_bytes:
            fits = (cap - self._buffered_bytes) * seen // self._received_bytes
            wanted = min(wanted, max(1, fits))
        return min(room, wanted)

    def num_to_request(self) -> int:
        """How many samples to request now: dealt ones at once, else up to the
        :meth:`shortfall` from the shard."""
        if self.by_need:
            return self.num_available
        return min(self.shortfall(), self.num_available)

    def request(self) -> list[int]:
        """Mark the next samples as requested; returns their positions."""
        count = self.num_to_request()
        positions: list[int] = []
        while len(positions) < count:
            block = self._dealt.popleft()
            take = min(len(block), count - len(positions))
            positions.extend(block[:take])
            if take < len(block):
                self._dealt.appendleft(block[take:])
        self._pending.update(positions)
        return positions

    def add(self, sample: SampleInfo) -> None:
        """A requested sample has arrived (in any order)."""
        self._check_requested(sample.position)
        self._buffer.append(sample)
        self._buffer_changed = True
        self._num_received += 1
        cost = self._row_cost(sample)
        self._buffered_cost += cost
        self._received_cost += cost
        self._buffered_bytes += sample.num_bytes
        self._received_bytes += sample.num_bytes

    def _row_cost(self, sample: SampleInfo) -> int:
        return math.ceil(self._budget.row_cost(sample.length))

    def skip(self, position: int) -> None:
        """A requested sample will never arrive (the runtime skipped it as bad input).

        It counts as received, so the window can become ready, and it is neither emitted
        nor dropped: ``shard_size == num_emitted + num_skipped + num_dropped``.
        """
        self._check_requested(position)
        self._num_received += 1
        self.num_skipped += 1

    def _check_requested(self, position: int) -> None:
        if position not in self._pending:
            raise ValueError(f"sample at shard position {position} was not requested")
        self._pending.remove(position)

    def is_ready(self) -> bool:
        """Every requested sample arrived and the window cannot take more."""
        return self.num_in_flight == 0 and self.num_to_request() == 0

    def is_finished(self) -> bool:
        return (
            self._undealt == 0
            and self.num_available == 0
            and self.num_in_flight == 0
            and (not self._buffer)
        )

    def wanted(self) -> int:
        """Samples to ask the round to deal (dealt by need, while any are undealt)."""
        return self.shortfall() if self.by_need and self._undealt else 0

    # -- one round -------------------------------------------------------------------
    def make_report(self) -> RankReport:
        """Group the window and describe it for the exchange (see :mod:`wire`).

        Its ``free_slots`` is always ``max_steps_per_round``: back-pressure is per batch in
        the runtime (a step takes an output slot when it is collated), so what a round
        sees never depends on how fast the consumer is."""
        if not self.is_ready():
            raise RuntimeError("the window is not ready: samples are still in flight")
        max_steps = self.round_step_cap()
        wanted = self.wanted()
        full = wanted == 0
        # A window that is not full only asks for samples: the round emits nothing
        # (dealing by fetch time, it may emit if it is at its share: dealing.ready).
        groups = self._grouped() if full or self.policy.fetch_aware_dealing else []
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
            group_costs=tuple(_step_cost(g, self._budget) for g in shown),
            peel_costs=tuple(cost for _, cost, _ in peels),
            peel_savings=tuple(saving for _, _, saving in peels),
            undealt=self._undealt,
            wanted=wanted,
            full=full,
            dealt_cost=self._received_cost + self._moved_cost,
            dealt_samples=self._num_received - self.num_skipped + self._moved_balance,
            wait_us=self.wait_us,
            elapsed_us=self.elapsed_us,
        )

    @property
    def _moved_balance(self) -> int:
        """Samples moved in less moved out (pooled rounds)."""
        return self.num_moved_in - self.num_moved_out

    def _grouped(self) -> list[Group]:
        """The buffer's groups, oldest first; grouped again only if the buffer changed."""
        if self._buffer_changed:
            groups = group_window(self._buffer, self._budget, patch_budget=self.config.patch_budget)
            groups.sort(key=lambda g: g.age)
            self._cached_groups = groups
            self._buffer_changed = False
            self.num_grouped += len(self._buffer)
        return list(self._cached_groups)

    def round_step_cap(self) -> int:
        """The most steps this round may emit: ``max_steps_per_round``, and while the
        ramp lasts a share of its target (:data:`RAMP_STEP_SHARE`)."""
        cap = self.policy.max_steps_per_round
        if self._ramp and RAMP_STEP_SHARE is not None:
            cap = min(cap, max(1, math.floor(self._ramp[0] * RAMP_STEP_SHARE)))
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
            return RoundOutcome()
        if self._ramp:
            self._ramp.popleft()
        local = self._local_steps(groups, plan)
        columns = list(zip(*plan.rank_costs, strict=True))
        costs = [(max(column), sum(column)) for column in columns]
        return RoundOutcome(
            steps=self._steps(local, plan.global_samples, plan.global_loss_tokens, costs)
        )

    def _steps(
        self,
        local: list[Group | None] | tuple[Group | None, ...],
        global_samples: tuple[int, ...],
        global_loss_tokens: tuple[int, ...],
        costs: list[tuple[int, int]],
    ) -> tuple[Step, ...]:
        """The round's steps in the emission order (``costs``: per position, the slowest
        rank's cost and the ranks' sum)."""
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

    def pool_offer(self) -> list[SampleInfo]:
        """This window's samples, offered to a pooled round (``RoundPlan.pooled``)."""
        if self._groups is None:
            raise RuntimeError("pool_offer() needs make_report() first in every round")
        return sorted(self._buffer, key=lambda s: s.position)

    def apply_pool(self, plan: PoolPlan) -> RoundOutcome:
        """Act on this rank's row of a pooled round: run its groups (some of their
        samples offered by other ranks), give away those of its samples another rank runs,
        and keep those no step runs (``PoolPlan.left``)."""
        if self._groups is None:
            raise RuntimeError("apply_pool() needs make_report() first in every round")
        self._groups = None
        self.round_index += 1
        if self._ramp:
            self._ramp.popleft()
        local = plan.rank_groups[self.rank]
        received, given = plan.moved(self.rank)
        left = list(plan.left[self.rank]) if plan.left else []
        held = {s.position for s in self._buffer}
        if (
            any(s.position not in held for s in given)
            or any(s.position in held for s in received)
            or any(s.position not in held for s in left)
        ):
            raise AlignmentError(
                f"rank {self.rank}: the pooled plan moves samples it does not hold"
            )
        run = sum(g.size for g in local if g is not None)
        if len(given) + run - len(received) + len(left) != len(held):
            raise AlignmentError(f"rank {self.rank}: the pooled plan loses samples of its window")
        self.num_moved_in += len(received)
        self.num_moved_out += len(given)
        self.moved_in_bytes += sum(s.num_bytes for s in received)
        # The work this rank holds changes by what moved: dealing by need levels it.
        self._moved_cost += sum(map(self._row_cost, received)) - sum(map(self._row_cost, given))
        kept = [g for g in local if g is not None]
        runners = plan.runners() if given else {}
        self._buffer = left
        self._buffer_changed = True
        self._buffered_cost = sum(map(self._row_cost, left))
        self._buffered_bytes = sum(s.num_bytes for s in left)
        self.num_emitted += sum(g.size for g in kept)
        self._count_alone(kept)
        costs = list(zip(plan.max_costs, plan.cost_sums, strict=True))
        return RoundOutcome(
            steps=self._steps(local, plan.global_samples, plan.global_loss_tokens, costs),
            pooled=True,
            moved_in=tuple(s.position for s in received),
            moved_out=tuple(s.position for s in given),
            moved_to=tuple(runners[s.position] for s in given),
        )

    def _receive_deal(self, deals: tuple[int, ...]) -> None:
        # The global order is dealt in rank order from its first undealt position.
        if not deals:
            return
        start = self.shard_size - self._undealt + sum(deals[: self.rank])
        if deals[self.rank]:
            self._dealt.append(range(start, start + deals[self.rank]))
        self.num_dealt += deals[self.rank]
        self._undealt -= sum(deals)

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
            self._take(kept)
        sizes = tuple(0 if g is None else g.size for g in local)
        if sizes != plan.rank_sizes[self.rank]:
            raise AlignmentError(
                f"rank {self.rank} formed steps of sizes {sizes}, the plan says "
                f"{plan.rank_sizes[self.rank]}"
            )
        return local

    def _take(self, kept: list[Group]) -> None:
        emitted = {s.position for g in kept for s in g.samples}
        self._buffer = [s for s in self._buffer if s.position not in emitted]
        self._buffer_changed = True
        self._buffered_cost = sum(map(self._row_cost, self._buffer))
        self._buffered_bytes = sum(s.num_bytes for s in self._buffer)
        self.num_emitted += len(emitted)
        self._count_alone(kept)

    def _count_alone(self, kept: list[Group]) -> None:
        self.num_over_budget += sum(
            1 for g in kept if g.size == 1 and self._budget.is_over_budget(g.longest)
        )
        patch_budget = self.config.patch_budget
        if patch_budget is not None:
            alone = [g.samples[0] for g in kept if g.size == 1]
            self.num_over_patch_budget += sum(
                patch_budget.sample_cost(s.num_patches, s.patch_square_sum)
                > patch_budget.max_patches
                for s in alone
            )

    def _end_epoch(self) -> RoundOutcome:
        self.epoch_over = True
        held = self.num_dealt + self.num_moved_in - self.num_moved_out
        self.num_dropped = held - self.num_emitted - self.num_skipped
        self._buffer = []
        self._buffer_changed = True
        self._buffered_cost = 0
        self._buffered_bytes = 0
        return RoundOutcome(epoch_over=True, dropped=self.num_dropped)


def exchange_round(window: GroupingWindow, exchange: Exchange) -> RoundOutcome:
    """One round as the runtime runs it: report, all-gather, plan, act. A pooled round
    (``cross_rank_grouping``) all-gathers the windows' offers too, and its outcome names
    the samples that move (``moved_in``, ``moved_out``)."""
    max_steps = window.policy.max_steps_per_round
    message = encode_report(window.make_report(), max_steps)
    reports = [decode_report(m, max_steps) for m in exchange(message)]
    pool_steps = max_steps if window.policy.groups_across_ranks else None
    plan = plan_round(
        reports,
        join=window.policy.join,
        pool_max_steps=pool_steps,
        pool_below=window.policy.pool_below_sync,
        fetch_aware=window.policy.fetch_aware_dealing,
    )
    if not plan.pooled:
        return window.apply(plan)
    width = max(r.buffered for r in reports)
    offers = [decode_offer(m) for m in exchange(encode_offer(window.pool_offer(), width))]
    pool = plan_pool(
        offers,
        window.config.budget,
        patch_budget=window.config.patch_budget,
        positions=plan.pool_positions,
    )
    return window.apply_pool(pool)
