"""Dealing by need: how many samples of the epoch's global order each rank is dealt in a
round (``shard_dealing=by_need``), and whether the round may emit.

Every rank calls these on the same gathered reports
(:func:`~odb_lightning.core.alignment.plan_round`), so every rank deals alike. The deal
levels the ranks' work; with ``fetch_aware_dealing`` (on by default with
``shard_dealing=by_need``), once the ranks' fetch speeds differ materially, it levels
their time instead, counting how long each rank waited for its own samples
(:func:`fetch_shares`), and a rank whose window holds more of the waiting samples than its
speed warrants is behind (:func:`behind_ranks`): rounds then group per rank, so no sample
moves toward it (``core.pooling``). With ``fetch_aware_dealing=false`` neither reads a
time, and the rounds are a function of the samples alone.
"""

from __future__ import annotations

import math

from odb_lightning.core.wire import RankReport

MIN_US_PER_COST = 1e-6
"""The least time per unit of work :func:`fetch_shares` credits a rank with, so a rank
that never waited and a common part of 0 give a finite share."""
MATERIAL_SPEED_RATIO = 1.5
"""Fetch speeds differ materially when the slowest rank's time per unit of work is at
least this many times the fastest's; below it the shares stay equal."""
MATERIAL_WAIT_SHARE = 0.1
"""... and when the slowest rank has spent at least this share of its epoch so far
waiting for its own samples (else fetching does not bound the epoch)."""


def fetch_shares(reports: list[RankReport]) -> list[float] | None:
    """Each rank's share of the epoch's work when dealing sees fetch time
    (``fetch_aware_dealing``), or ``None`` (equal shares) before any rank waited.

    A rank's time per unit of work is the common part (the least, over ranks, of the
    time it did not wait for its own samples per unit of work it received: what every
    rank spends in the lock-stepped rounds) plus its own wait per unit of work (its fetch
    backlog). Shares are inverse to it: a rank whose samples arrive twice as slowly,
    when fetching bounds the epoch, is dealt about half the work. While the ranks' speeds
    do not differ materially (:data:`MATERIAL_SPEED_RATIO`, :data:`MATERIAL_WAIT_SHARE`:
    timing noise, or no rank waits) there are none. Every rank computes them from the same
    reports."""
    timed = [r for r in reports if r.dealt_cost > 0]
    if not timed or not any(r.wait_us for r in timed):
        return None
    common = min(max(0, r.elapsed_us - r.wait_us) / r.dealt_cost for r in timed)
    per_work = {
        rank: common + r.wait_us / r.dealt_cost for rank, r in enumerate(reports) if r.dealt_cost
    }
    slowest = max(per_work, key=per_work.__getitem__)
    waited = reports[slowest].wait_us >= MATERIAL_WAIT_SHARE * reports[slowest].elapsed_us
    fastest = max(MIN_US_PER_COST, min(per_work.values()))
    if not waited or per_work[slowest] < MATERIAL_SPEED_RATIO * fastest:
        return None
    typical = sorted(per_work.values())[len(per_work) // 2]  # for a rank with no work yet
    speeds = [1 / max(MIN_US_PER_COST, per_work.get(rank, typical)) for rank in range(len(reports))]
    total = sum(speeds)
    return [speed / total for speed in speeds]


def behind_ranks(reports: list[RankReport]) -> list[int]:
    """The ranks that are behind: their windows hold more of the samples waiting to run
    than their fetch speed warrants (each holds more than its :func:`fetch_shares` share
    of all buffered samples, by more than one sample). A round that moved samples toward
    such a rank would leave its own waiting longer. None while the speeds do not differ
    materially. Read where dealing sees fetch time (``deals_by_fetch_time``): until the
    deal has brought the slow rank's share down, its window holds more than its share."""
    shares = fetch_shares(reports)
    if shares is None:
        return []
    held = sum(r.buffered for r in reports)
    return [
        rank
        for rank, (r, share) in enumerate(zip(reports, shares, strict=True))
        if r.buffered > share * held + 1
    ]


def deal_caps(reports: list[RankReport], *, fetch_aware: bool = False) -> list[int]:
    """The most samples each rank may be dealt this round, balancing the ranks' work.

    Before any sample arrived: half an equal share, ``ceil(undealt / 2W)``. After: half
    of what would bring the rank to an equal share of the epoch's work (what every rank
    received, plus the undealt samples at the mean cost per sample received), rounded up;
    0 for a rank already at or above its share. Halving lets each round correct the last
    one's error (a dealt sample's cost is known only once it arrives), so the ranks end
    the epoch with work equal to within about a sample; dealing ends in
    ``O(log undealt)`` more rounds than dealing all at once.

    ``fetch_aware``: the shares are :func:`fetch_shares` instead of equal.
    """
    world, left = len(reports), reports[0].undealt
    cost = sum(r.dealt_cost for r in reports)
    count = sum(r.dealt_samples for r in reports)
    if cost == 0 or count == 0:
        return [-(-left // (2 * world))] * world
    shares = fetch_shares(reports) if fetch_aware else None
    if shares is None:
        # need_r = (count + left) / W - dealt_cost_r x count / cost samples, halved.
        scale = 2 * world * cost
        return [
            max(0, -(-((count + left) * cost - world * r.dealt_cost * count) // scale))
            for r in reports
        ]
    return [
        max(0, math.ceil(((count + left) * share - r.dealt_cost * count / cost) / 2))
        for r, share in zip(reports, shares, strict=True)
    ]


def deal_counts(
    reports: list[RankReport], *, fetch_aware: bool = False, caps: list[int] | None = None
) -> tuple[int, ...]:
    """Samples each rank is dealt: what it wanted, within its :func:`deal_caps` (so a
    window bigger than the data cannot starve the ranks after it, and the ranks' work
    stays level), in rank order while any are left. If that deals nothing while some
    rank wants samples (the ranks below their share have full windows), each rank that
    wants one gets one: every round that only deals deals a sample. Dealing by fetch
    time (``fetch_aware``), a rank at its share is ready instead (:func:`ready`) and
    gets none. ``caps``: this round's :func:`deal_caps`, when the caller has them."""
    left = reports[0].undealt
    fetch_aware = fetch_aware and fetch_shares(reports) is not None  # else: by work
    if caps is None:
        caps = deal_caps(reports, fetch_aware=fetch_aware)
    if not fetch_aware and not any(
        min(r.wanted, cap) for r, cap in zip(reports, caps, strict=True)
    ):
        caps = [1] * len(reports)
    deals = []
    for report, cap in zip(reports, caps, strict=True):
        deal = min(report.wanted, cap, left)
        deals.append(deal)
        left -= deal
    return tuple(deals)


def ready(
    reports: list[RankReport], *, fetch_aware: bool = False, caps: list[int] | None = None
) -> bool:
    """Whether the round may emit: every unfinished window is full, or, dealing by fetch
    time, at its share (its :func:`deal_caps` is 0: waiting for more would be dealt
    nothing; an empty one runs IDLE steps). The caps sum to at least the undealt
    samples' need, so some rank is below its share: it is full, or the round deals it a
    sample. ``caps``: this round's :func:`deal_caps`, when the caller has them."""
    fetch_aware = fetch_aware and fetch_shares(reports) is not None  # else: by work
    if fetch_aware and caps is None:
        caps = deal_caps(reports, fetch_aware=True)
    return all(
        r.full or (fetch_aware and caps is not None and caps[rank] == 0)
        for rank, r in enumerate(reports)
        if not r.finished
    )
