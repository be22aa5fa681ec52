"""The window ramp (``batching.policy.ramp_budgets``): the budgets of work the grouping
window fills to in the epoch's first emitting rounds, and the steps each such round may
emit. :class:`~odb_lightning.core.window.GroupingWindow` follows it; every rank counts the
same emitting rounds, so every rank ramps in step and what a round sees stays a function
of the data (experiments/ramp).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.wire import RankReport

RAMP_GROWTH = 4
"""How much the ramp's window grows per emitting round. Each round's steps train while the
workers fetch the next, larger window, so the pipeline keeps up while fetching a budget
takes under a quarter of a step; every ramp round groups a small window, so fewer rounds
cost fewer steps (experiments/ramp measures 2, 4 and 8)."""


RAMP_STEP_SHARE: float | None = 0.125
"""The steps a ramp round may emit, per budget of its target (at least one): 1, 1 and 4
steps at 2, 8 and 32 budgets (where rounds group across ranks the last ramp round covers
the full window's refill instead: :func:`ramp_step_cap`). A small window groups its
samples poorly and, across ranks, a round's ``T`` is its largest group count; emitting a
few steps and keeping the rest in the window to be grouped with the next arrivals costs
the ramp far fewer of the epoch's steps than emitting every group (experiments/ramp).
``None``: a ramp round emits every group."""


def full_window_budgets(policy: OnlinePolicy) -> int:
    """The full window in budgets of work: ``window_budgets``, or for a window of ``D``
    samples ``D`` budgets (taking a sample to cost at most a budget)."""
    return policy.window_budgets or policy.outstanding_depth


def ramp_targets(policy: OnlinePolicy) -> tuple[int, ...]:
    """The budgets of work the window fills to in the epoch's first emitting rounds, one
    per round, before it fills to the full window (empty: no ramp). The ramp ends where it
    would reach the full window (:func:`full_window_budgets`)."""
    full = full_window_budgets(policy)
    targets: list[int] = []
    budgets = policy.ramp_budgets
    while budgets is not None and budgets < full:
        targets.append(budgets)
        budgets *= RAMP_GROWTH
    return tuple(targets)


def ramp_step_cap(policy: OnlinePolicy, targets: Sequence[int], *, pooled: bool) -> int:
    """The steps a ramp round may emit (``targets``: the ramp's targets still to come, this
    round's first; see :attr:`~odb_lightning.core.window.GroupingWindow.round_step_cap`).

    A ramp round emits :data:`RAMP_STEP_SHARE` of its target (at least one). Where rounds
    group across ranks (``pooled``: a round of the epoch has pooled, as the ramp's first
    rounds do wherever they can), the ramp's last round emits
    ``ceil((F - t) / (RAMP_GROWTH - 1))`` steps instead (``F``: the full window, ``t``:
    its target; 32 steps at 32 of 128 budgets, at most ``t``): the next round waits for
    the window's refill of ``F - t`` budgets and more, and then plans the first full
    pooled round over the union of every window, the costliest of the epoch's rounds to
    plan. Those steps train meanwhile, so that round is planned off the critical path
    where the ramp's pipeline rule holds (fetching a budget takes under
    ``1 / RAMP_GROWTH`` of a step). Simulated, an epoch's steps per rank change by at most
    one and its utilization by at most 0.003, except on an epoch of less than a window
    per rank (Chit-Chat at 2 ranks: 0.978 -> 0.970; experiments/ramp). Every rank's
    window counts the same pooled rounds, so every rank gives the same cap: a function of
    the data, as every round's plan."""
    target = targets[0]
    if RAMP_STEP_SHARE is None:
        return policy.max_steps_per_round
    if pooled and len(targets) == 1:
        full = full_window_budgets(policy)
        return max(1, min(target, math.ceil((full - target) / (RAMP_GROWTH - 1))))
    return max(1, math.floor(target * RAMP_STEP_SHARE))


SMALL_EPOCH_BUDGETS = 16
"""An epoch with at most this many budgets of work per rank left is grouped whole: the
ramp ends (:func:`ramp_ends`), the window fills to the rest of the epoch and one round
groups it all, as an offline packer of the whole epoch would. Each ramp round costs an
epoch up to a step (its few steps are grouped from a small window), which on an epoch of
a few budgets per rank is a large share; fetching 16 budgets takes under 4 steps where the
ramp's pipeline rule holds (a budget under a quarter of a step; a bound, not measured;
experiments/sync_efficiency small_epochs)."""


@dataclass(frozen=True, slots=True)
class EpochLeft:
    """What is left of an epoch dealt by need when a round starts, from every rank's
    report, so the same on every rank.

    Attributes:
        samples: The samples no step has run yet: in every window, and not dealt yet.
        seen_cost: The row costs of every sample received this epoch (each rounded up);
            ``seen_samples`` how many.
        world: The ranks.
    """

    samples: int
    seen_cost: int
    seen_samples: int
    world: int

    @classmethod
    def of(cls, reports: Sequence[RankReport]) -> EpochLeft:
        return cls(
            samples=sum(r.buffered for r in reports) + reports[0].undealt,
            seen_cost=sum(r.dealt_cost for r in reports),
            seen_samples=sum(r.dealt_samples for r in reports),
            world=len(reports),
        )

    def per_rank(self, emitted: int) -> float:
        """The cost left per rank once the round has run ``emitted`` samples: the samples
        left at the mean cost of those seen (a seeded order: the seen are a fair draw)."""
        if not self.seen_samples:
            return math.inf
        left = max(0, self.samples - emitted)
        return left * self.seen_cost / (self.seen_samples * self.world)


def ramp_ends(
    policy: OnlinePolicy, targets: Sequence[int], left: EpochLeft, emitted: int, token_budget: int
) -> bool:
    """Whether the ramp ends after a round (``targets``: the ramp's targets still to come,
    the one the window fills to now first; ``left``: what was left of the epoch as the
    round started, ``emitted`` the samples it ran; :meth:`EpochLeft.per_rank`): where
    the rest of the epoch is small (:data:`SMALL_EPOCH_BUDGETS` budgets per rank) or fits
    the window the ramp fills to now. The window then fills to the rest of the epoch,
    and the next emitting round groups it all, with no ramp cap splitting it into rounds
    that nothing more arrives for. The samples seen must hold half the ranks' first ramp
    window of work (``ramp_budgets``) before their mean tells the epoch's size."""
    first = (policy.ramp_budgets or 0) * token_budget
    if not targets or 2 * left.seen_cost < left.world * first:
        return False
    return left.per_rank(emitted) <= max(SMALL_EPOCH_BUDGETS, targets[0]) * token_budget
