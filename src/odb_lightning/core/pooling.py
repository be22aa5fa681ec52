"""Grouping across ranks (``batching.policy.cross_rank_grouping``): the pooled round.

Each rank grouping only its own window cannot go below the per-rank floor: its samples
grouped alone. A pooled round groups the *union* of the windows instead, as one window of
``W`` times the samples, and hands the groups out ``W`` at a time
(:func:`~odb_lightning.core.pool_plan.plan_pool`). Three kinds of emitting round pool
instead of running :func:`~odb_lightning.core.alignment.plan_round`'s ordinary plan
(:meth:`PooledRound.of`):

* the epoch's tail: every round once nothing is undealt (:func:`pools`). When the
  ordinary round would drain every window, every offered sample runs; when a window holds
  ``Q`` groups or more, the round runs the union's costliest ``Q x W`` and the next round
  pools the rest (:func:`tail_pool_positions`), so the tail's last remnant is grouped over
  every rank, not per rank. On a small epoch (one window per rank) the tail is the whole
  epoch after the ramp;
* a ramp round (:func:`ramp_pool_positions`): small windows, whose best groups differ most
  from rank to rank;
* an uneven round (:func:`uneven`): at the default ``pool_below_sync=1.0`` every round
  whose aligned steps are not exactly level, so the ranks group as one window; at 0.97
  only rounds clearly uneven, such as one whose samples over the budget (each run alone)
  are more on some ranks than on others.

A capped round (a tail round over ``Q``, and the last two kinds) runs only the costliest
``T x W`` groups of the union (``T``: the round's step positions) and leaves the other
samples in the windows that hold them (``PoolPlan.left``).

A round is one :class:`PooledRound`, decided from the reports and the ordinary plan, so
every rank decides alike. Every rank offers its window's samples (:meth:`PooledRound.gather`,
a second all-gather), plans the union (:meth:`PooledRound.plan`, the same plan on every
rank) and takes its row (:meth:`PooledRound.share`). A sample a rank runs but did not
hold is *moved*: it belongs to the rank that runs it, and it runs in the round that moves
it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from odb_lightning.core.alignment import AlignmentError, RoundPlan
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.dealing import behind_ranks
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.pool_plan import PoolPlan, plan_pool
from odb_lightning.core.ramp import EpochLeft
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.wire import RankReport

MAX_POOL_SAMPLES = 262_144
"""Most samples the windows may hold together for a round to group across ranks. Every
rank plans a pooled round over the whole union (:func:`~odb_lightning.core.pool_plan.plan_pool`,
in CPU time about linear in it: experiments/planner_cost), and the round waits for that
plan, so larger jobs group per rank."""


def pools(reports: list[RankReport]) -> bool:
    """Whether an emitting round is the epoch's tail, which groups across ranks: nothing
    is undealt and every unfinished window is full, so what the windows hold is all the
    epoch has left. It runs the whole union when every window shows fewer than ``Q``
    groups (:func:`tail_pool_positions`), else its costliest ``Q x W`` groups, and the
    next round pools what is left."""
    active = [r for r in reports if not r.finished]
    return (
        bool(active)
        and all(r.undealt == 0 for r in reports)
        and all(r.full for r in active)
        and any(r.buffered for r in active)
    )


def tail_pool_positions(reports: list[RankReport], max_steps: int) -> int | None:
    """The step positions of a pooled tail round: ``None`` (every offered sample runs)
    when every unfinished window shows fewer than ``max_steps`` groups, so the ordinary
    round would drain them all; else ``max_steps``."""
    drains = all(r.num_groups < max_steps for r in reports if not r.finished)
    return None if drains else max_steps


def uneven(rank_costs: tuple[tuple[int, ...], ...], below: float) -> bool:
    """Whether a round's aligned steps (per rank, the cost of each step position, IDLE
    0) sum to less than ``below`` (``pool_below_sync``) of every rank running each
    position as long as its slowest rank does."""
    maxima = sum(max(column) for column in zip(*rank_costs, strict=True))
    return sum(map(sum, rank_costs)) < below * len(rank_costs) * maxima


def ramp_pool_positions(reports: list[RankReport], max_steps: int) -> int | None:
    """The step positions of a ramp round pooled across ranks, or ``None``.

    A ramp round (every report's ``free_slots``, the window's step cap, below
    ``max_steps``) emits a few steps from small windows, whose best groups differ most
    across ranks. Pooled, it runs the costliest ``T x W`` groups of the union
    (``T`` = the cap) and leaves every other sample in the window that holds it."""
    active = [r for r in reports if not r.finished]
    cap = min(r.free_slots for r in reports)
    if not active or cap >= max_steps or not all(r.full for r in active):
        return None
    return cap if any(r.buffered for r in active) else None


@dataclass(frozen=True, slots=True)
class RankShare:
    """One rank's row of a pooled round, checked against the window that acts on it.

    Attributes:
        groups: Its group at each step position (``None``: IDLE).
        received: The samples it runs that another rank offered.
        given: The samples it offered that another rank runs; ``given_to``: that rank.
        left: The samples it offered that no step of the round runs: they stay in its
            window.
    """

    groups: tuple[Group | None, ...]
    received: tuple[SampleInfo, ...]
    given: tuple[SampleInfo, ...]
    given_to: tuple[int, ...]
    left: tuple[SampleInfo, ...]


@dataclass(frozen=True, slots=True)
class PooledRound:
    """A round that groups the union of the windows across ranks, identical on every rank.

    Attributes:
        positions: The most step positions it runs (a ramp round's cap, ``Q`` for a tail
            round whose windows hold more, an uneven round's ``T``; the samples of the
            groups it does not run stay where they are); ``None``: every offered sample
            runs.
        width: The most samples any window holds (from the reports): every offer is
            padded to it, so the all-gather's messages have one size.
        config: The job's batching settings (the budgets the union is grouped under).
        left: What is left of the epoch as the round starts (the ordinary plan's).
    """

    positions: int | None
    width: int
    config: BatchingConfig
    left: EpochLeft | None = None

    @classmethod
    def of(
        cls, reports: list[RankReport], plan: RoundPlan, config: BatchingConfig
    ) -> PooledRound | None:
        """The pooled round an emitting round is instead of ``plan`` (the ordinary plan of
        ``reports``), or ``None``. A round that emits nothing has nothing to group; one
        rank has nothing to group across; a union over :data:`MAX_POOL_SAMPLES` would
        cost every rank too long to plan; and, where dealing sees fetch time
        (``deals_by_fetch_time``), while a rank is behind (its window holds more of the
        waiting samples than its fetch speed warrants, :func:`~.dealing.behind_ranks`) a
        pooled round could move samples toward it: those rounds stay ordinary, as every
        round does where rounds do not group across ranks (``groups_across_ranks``: join
        only). With ``fetch_aware_dealing=false`` nothing here reads a time: the rounds are
        a function of the samples alone, as the simulator plans them."""
        policy: OnlinePolicy = config.policy  # type: ignore[assignment]
        if (
            not plan.target_steps
            or not policy.groups_across_ranks
            or len(reports) < 2
            or sum(r.buffered for r in reports) > MAX_POOL_SAMPLES
            or (policy.deals_by_fetch_time and behind_ranks(reports))
        ):
            return None
        width = max(r.buffered for r in reports)
        max_steps = policy.max_steps_per_round
        if pools(reports):
            return cls(tail_pool_positions(reports, max_steps), width, config, plan.left)
        positions = ramp_pool_positions(reports, max_steps)
        if positions is not None:
            return cls(positions, width, config, plan.left)
        if uneven(plan.rank_costs, policy.pool_below_sync):
            return cls(plan.target_steps, width, config, plan.left)
        return None

    def gather(
        self, offer: list[SampleInfo], exchange: Callable[[list[int]], list[list[int]]]
    ) -> list[list[SampleInfo]]:
        """Every rank's offer, by rank: ``offer`` (this window's samples) all-gathered
        (``exchange``: the round's all-gather, :data:`~odb_lightning.core.window.Exchange`)."""
        return [decode_offer(m) for m in exchange(encode_offer(offer, self.width))]

    def plan(self, offers: list[list[SampleInfo]]) -> PoolPlan:
        """Group the union of ``offers`` and hand the groups out (the same on every rank)."""
        return plan_pool(
            offers,
            self.config.budget,
            patch_budget=self.config.patch_budget,
            positions=self.positions,
        )

    def share(self, plan: PoolPlan, rank: int, held: list[SampleInfo]) -> RankShare:
        """``rank``'s row of ``plan``, for the window that holds ``held``: it runs its
        groups, gives away those of its samples another rank runs and keeps those no step
        runs (``PoolPlan.left``).

        Raises:
            AlignmentError: The plan moves or keeps samples the window does not hold, or
                loses some of those it holds.
        """
        received, given = plan.moved(rank)
        left = plan.left[rank] if plan.left else ()
        positions = {s.position for s in held}
        if (
            any(s.position not in positions for s in given)
            or any(s.position in positions for s in received)
            or any(s.position not in positions for s in left)
        ):
            raise AlignmentError(f"rank {rank}: the pooled plan moves samples it does not hold")
        groups = plan.rank_groups[rank]
        run = sum(g.size for g in groups if g is not None)
        if len(given) + run - len(received) + len(left) != len(positions):
            raise AlignmentError(f"rank {rank}: the pooled plan loses samples of its window")
        runners = plan.runners() if given else {}
        return RankShare(
            groups=groups,
            received=tuple(received),
            given=tuple(given),
            given_to=tuple(runners[s.position] for s in given),
            left=tuple(left),
        )


OFFER_MARK = -1
"""First integer of an offers message: no round report starts with it (their first is
the wire version), so the channel's report check leaves it alone."""
_OFFER_FIELDS = (
    "position",
    "sample_id",
    "length",
    "num_loss_tokens",
    "num_patches",
    "num_image_tokens",
    "patch_square_sum",
    "num_bytes",
)


def encode_offer(samples: list[SampleInfo], width: int) -> list[int]:
    """``samples`` as ``2 + 8 x width`` integers (every rank pads to the same ``width``,
    the most samples any window buffers, which the round's reports give)."""
    if len(samples) > width:
        raise ValueError(f"an offer of {len(samples)} samples does not fit {width}")
    body = [getattr(s, name) for s in samples for name in _OFFER_FIELDS]
    return [OFFER_MARK, len(samples), *body, *[0] * (len(_OFFER_FIELDS) * (width - len(samples)))]


def decode_offer(message: list[int]) -> list[SampleInfo]:
    """Inverse of :func:`encode_offer`.

    Raises:
        ValueError: The message is not an offer.
    """
    fields = len(_OFFER_FIELDS)
    if len(message) < 2 or message[0] != OFFER_MARK or message[1] < 0:
        raise ValueError("not a pooled round's offer (mark or count)")
    count = message[1]
    if 2 + fields * count > len(message):
        raise ValueError(f"an offer of {count} samples in {len(message)} integers")
    return [
        SampleInfo(
            **dict(zip(_OFFER_FIELDS, message[2 + fields * i : 2 + fields * (i + 1)], strict=True))
        )
        for i in range(count)
    ]
