"""How a grouping window fills: the positions it owns and requests, the samples it holds,
when it is full, and where every sample went.

This is the half of :class:`~odb_lightning.core.window.GroupingWindow` that does not read
a plan: the rounds (that class) take samples out through :meth:`WindowFill._hold` and
count here those they emit or move, so every sample of the shard is counted in one place
(received, skipped, moved, emitted; what is left at the epoch's end is dropped). A window
sized in work decides how many samples it lacks only when nothing is in flight, from the
samples it holds (:meth:`WindowFill.shortfall`), so what a round sees is a function of
the samples that arrived, never of how fast they did: the same in production and in the
simulator.
"""

from __future__ import annotations

import math
from collections import deque

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import group_window
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.types import Group, SampleInfo


class WindowFill:
    """One rank's window for one epoch, as it fills.

    With fixed shards (``shard_dealing=fixed``) the window owns positions
    ``0..shard_size - 1`` of its shard. Dealt by need, ``shard_size`` is the length of the
    epoch's global order and the window owns the positions the rounds deal to it
    (:func:`~odb_lightning.core.dealing.deal_counts`).

    Args:
        config: Job-wide batching settings (identical on every rank).
        shard_size: Samples in this rank's shard (dealt by need: in the global order).
        rank: This rank's index in the reports (which positions of a deal are its own).
    """

    def __init__(self, config: BatchingConfig, shard_size: int, *, rank: int) -> None:
        if shard_size < 0:
            raise ValueError(f"shard_size must be >= 0, got {shard_size}")
        self.config = config
        self.policy: OnlinePolicy = config.policy  # type: ignore[assignment]
        self.shard_size = shard_size
        self.rank = rank
        self.by_need = self.policy.by_need
        self._budget = config.budget
        self._buffer: list[SampleInfo] = []
        # Row costs rounded up to integers, so the sums do not depend on arrival order.
        self._buffered_cost = 0  # of the buffered samples
        self._received_cost = 0  # ... and of every sample received this epoch
        self._buffered_bytes = 0  # serialized sizes, for window_max_mib
        self._received_bytes = 0
        self._undealt = shard_size if self.by_need else 0
        self._dealt: deque[range] = deque([] if self.by_need else [range(shard_size)])
        self.num_dealt = 0 if self.by_need else shard_size
        self._pending: set[int] = set()  # requested, not arrived
        self._num_received = 0
        self.num_skipped = 0
        self.num_moved_in = 0  # samples this rank ran that another rank offered
        self.num_moved_out = 0  # samples this rank offered that another rank ran
        self.moved_in_bytes = 0
        self._moved_cost = 0  # row costs moved in less moved out
        self.num_emitted = 0
        self.num_over_budget = 0  # single samples over the token budget
        self.num_over_patch_budget = 0  # single samples over max_patches
        # The last grouping of the buffer, reused while the buffer is unchanged (a full
        # window waits through rounds that only deal to other ranks).
        self._cached_groups: list[Group] = []
        self._buffer_changed = True
        self.num_grouped = 0  # samples grouped over the epoch's rounds (the planner's work)
        # The budgets of work the window fills to in the emitting rounds to come, while
        # the ramp lasts (the window sets them: ``core.ramp.ramp_targets``).
        self._ramp: deque[int] = deque()

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
    def dealt_cost(self) -> int:
        """Row costs of the samples this rank received this epoch and of those moved in,
        less those moved out: the work dealing by need levels across ranks."""
        return self._received_cost + self._moved_cost

    @property
    def dealt_samples(self) -> int:
        """The samples :attr:`dealt_cost` counts."""
        return self._num_received - self.num_skipped + self.num_moved_in - self.num_moved_out

    @property
    def target_budgets(self) -> int | None:
        """The token budgets of work the window fills to this round: the ramp's while it
        lasts, else ``window_budgets`` (``None``: the window is ``outstanding_depth``
        samples)."""
        return self._ramp[0] if self._ramp else self.policy.window_budgets

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

    def _receive_deal(self, deals: tuple[int, ...]) -> None:
        # The global order is dealt in rank order from its first undealt position.
        if not deals:
            return
        start = self.shard_size - self._undealt + sum(deals[: self.rank])
        if deals[self.rank]:
            self._dealt.append(range(start, start + deals[self.rank]))
        self.num_dealt += deals[self.rank]
        self._undealt -= sum(deals)

    def _move(self, received: tuple[SampleInfo, ...], given: tuple[SampleInfo, ...]) -> None:
        """A pooled round moved ``received`` into this window and ``given`` out of it."""
        self.num_moved_in += len(received)
        self.num_moved_out += len(given)
        self.moved_in_bytes += sum(s.num_bytes for s in received)
        self._moved_cost += sum(map(self._row_cost, received)) - sum(map(self._row_cost, given))

    def _grouped(self) -> list[Group]:
        """The buffer's groups, oldest first; grouped again only if the buffer changed."""
        if self._buffer_changed:
            groups = group_window(self._buffer, self._budget, patch_budget=self.config.patch_budget)
            groups.sort(key=lambda g: g.age)
            self._cached_groups = groups
            self._buffer_changed = False
            self.num_grouped += len(self._buffer)
        return list(self._cached_groups)

    def _hold(self, samples: list[SampleInfo]) -> None:
        """What the window holds once a round has taken samples out (or moved some in)."""
        self._buffer = samples
        self._buffer_changed = True
        self._buffered_cost = sum(map(self._row_cost, samples))
        self._buffered_bytes = sum(s.num_bytes for s in samples)

    def _count_emitted(self, kept: list[Group]) -> None:
        """A round emitted ``kept``; a sample in a group of its own may be over a budget."""
        self.num_emitted += sum(g.size for g in kept)
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
