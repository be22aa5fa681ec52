"""The window ramp (``batching.policy.ramp_budgets``): the budgets of work the grouping
window fills to in the epoch's first emitting rounds, and the steps each such round may
emit. :class:`~odb_lightning.core.window.GroupingWindow` follows it; every rank counts the
same emitting rounds, so every rank ramps in step and what a round sees stays a function
of the data (experiments/ramp).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from odb_lightning.core.online_policy import OnlinePolicy

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
