"""The online policy (the ``odb`` modes): the window, the dealing, the join and the
round size of the ODB runtime, which forms batches while the epoch runs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from odb_lightning.core.checks import (
    check_bool,
    check_positive,
    check_positive_int,
    enum_member,
    is_number,
)
from odb_lightning.core.policy import POLICY_KEY, Policy


class EmissionOrder(StrEnum):
    """The order in which a round's aligned step positions are emitted (the same on every
    rank: :func:`odb_lightning.core.order.emission_order`)."""

    SHUFFLED = "shuffled"
    """A seeded permutation of the positions."""
    PAIRED = "paired"
    """The position of the longest samples (supervised tokens per sample over every rank)
    next to that of the shortest, the second next to the second shortest, ...; the pairs
    in a seeded order."""


class ShardDealing(StrEnum):
    """How an epoch's samples reach the ranks' windows."""

    FIXED = "fixed"
    """Each rank owns a fixed shard (every ``W``-th index of the seeded order, or ``shard=``)."""
    BY_NEED = "by_need"
    """One seeded global order, dealt in every round to the ranks whose windows need work."""


@dataclass(frozen=True)
class OnlinePolicy(Policy):
    """Online dynamic batching: a window of preprocessed samples per rank, grouped longest
    first under the budget, aligned across ranks each round."""

    outstanding_depth: int = 8192
    """Window cap ``D``: most samples buffered or in flight per rank (the whole window
    when ``window_budgets`` is ``None``)."""
    window_budgets: int | None = 128
    """The window fills until its samples' row costs sum to this many ``token_budget``s
    (about as many full batches), within ``outstanding_depth`` samples; ``None``: the
    window is ``D`` samples (experiments/sync_efficiency chose 128)."""
    ramp_budgets: int | None = 2
    """The ramp: the first round of an epoch (and of a resumed one) emits once every
    window holds this many ``token_budget``s of work, not the full window; each round that
    emits multiplies it by 4 until it would reach ``window_budgets`` (a window of ``D``
    samples: ``D`` budgets), so the first step waits for a few batches' worth of samples,
    never for the whole window (``core.ramp.ramp_targets``). A ramp round emits only a
    few of its steps and keeps the rest for the next (``core.ramp.RAMP_STEP_SHARE``);
    where rounds group across ranks the last one emits the steps that train while the
    full window refills and its first pooled round is planned
    (``core.ramp.ramp_step_cap``). Dealt by need, an epoch with at most
    ``core.ramp.SMALL_EPOCH_BUDGETS`` budgets of work per rank left is grouped whole: the
    ramp ends (``core.ramp.ramp_ends``). ``None``, or a value at or above the full window:
    no ramp (experiments/ramp)."""
    window_max_mib: float | None = 1024.0
    """Most MiB of serialized samples the window sized in work holds (meant for
    image-heavy samples); ``None``: no cap. The emitted steps waiting to be collated (at
    most one round's) and the queued batches come on top."""
    shard_dealing: ShardDealing = ShardDealing.BY_NEED
    """``by_need``: one seeded global order dealt each round to the windows that lack
    work, levelling the ranks' work so they finish together (a loader takes the order as
    ``order=``); ``fixed``: each rank owns a shard (every ``W``-th index, or ``shard=``)."""
    max_steps_per_round: int = 128
    """``Q``: most steps one alignment round emits per rank (as many as the window holds
    budgets: a round may drain it, and each sample is grouped about once)."""
    emission_order: EmissionOrder = EmissionOrder.SHUFFLED
    """``shuffled``: a round's steps are emitted in a seeded order (seed, epoch, round),
    the same on every rank, so the cost alignment holds and training sees no long-to-short
    sawtooth; ``paired``: the same, with the longest step next to the shortest, so the
    micro-batches of one optimizer step (``model.step.tokens_per_step``, gradient
    accumulation) hold long and short samples (experiments/quality); token-target steps
    take ``paired`` unless the command line names this key."""
    cross_rank_grouping: bool | None = None
    """Group across ranks where each rank alone groups poorly: the epoch's tail (every
    round once nothing is undealt), the ramp's rounds, and rounds whose aligned steps are
    not level (below ``pool_below_sync``). Such a round groups the union of the windows and
    hands the groups out ``W`` at a time in cost order, moving samples between ranks over
    the metadata channel, each only to the rank that runs it (``core.pooling``;
    ``summary.json`` counts ``moved_samples`` and ``moved_bytes``). ``None`` (the
    default): on where it applies, with ``shard_dealing=by_need`` and ``join`` (the
    defaults), off otherwise; ``true``: on, refused without those two; ``false``: off,
    each rank groups only its own samples (``groups_across_ranks`` is the outcome)."""
    pool_below_sync: float = 1.0
    """When rounds group across ranks (``cross_rank_grouping``): an emitting round whose
    aligned steps would reach a sync efficiency below this (the ranks' costs summed over
    ``W`` times the positions' maxima, ``core.pooling.uneven``) groups across ranks
    instead. 1.0: every round that is not exactly level, so the ranks group as one
    window (most samples then run on a rank that did not fetch them); 0.97: only rounds
    clearly uneven, such as a tail over the budget, so long epochs move fewer bytes for
    a little less utilization (experiments/sync_efficiency). In ``(0, 1]``."""
    fetch_aware_dealing: bool | None = None
    """Deal by need in proportion to how fast each rank gets its samples, not only to
    its work: every rank reports how long it waited for its own samples
    (``core.dealing.fetch_shares``), and once one rank's samples arrive materially slower
    than another's (``MATERIAL_SPEED_RATIO``, while waiting takes a material share of its
    epoch, ``MATERIAL_WAIT_SHARE``) it is dealt less of the rest of the epoch, so the
    fast ranks take over its share and the epoch ends near their time; a rank at its
    share emits without waiting for more. Until then the deal is the one by work. The
    steps then depend on timing (the simulator's are those of no waiting); every sample
    still runs once and resume stays exact. ``None`` (the default): on with
    ``shard_dealing=by_need``, off with fixed shards; ``true`` needs ``by_need``
    (experiments/slow_rank)."""
    join: bool = True
    """Every sample once per epoch (IDLE steps for finished ranks); ``false``: end the
    epoch at the first finished rank and count the rest as dropped."""

    online: ClassVar[bool] = True

    def __post_init__(self) -> None:
        key = POLICY_KEY
        check_positive_int(f"{key}.outstanding_depth", self.outstanding_depth)
        check_positive_int(f"{key}.window_budgets", self.window_budgets, optional=True)
        check_positive_int(f"{key}.ramp_budgets", self.ramp_budgets, optional=True)
        check_positive(f"{key}.window_max_mib", self.window_max_mib, "MiB", optional=True)
        dealing = enum_member(ShardDealing, f"{key}.shard_dealing", self.shard_dealing)
        object.__setattr__(self, "shard_dealing", dealing)
        check_positive_int(f"{key}.max_steps_per_round", self.max_steps_per_round)
        emission = enum_member(EmissionOrder, f"{key}.emission_order", self.emission_order)
        object.__setattr__(self, "emission_order", emission)
        check_bool(f"{key}.join", self.join)
        if self.cross_rank_grouping is not None:
            check_bool(f"{key}.cross_rank_grouping", self.cross_rank_grouping)
        if self.fetch_aware_dealing is not None:
            check_bool(f"{key}.fetch_aware_dealing", self.fetch_aware_dealing)
        if not (is_number(self.pool_below_sync) and 0 < self.pool_below_sync <= 1):
            raise ValueError(
                f"{key}.pool_below_sync must be a number in (0, 1] (a sync efficiency), got "
                f"{self.pool_below_sync!r}"
            )
        if self.fetch_aware_dealing is True and not self.by_need:
            raise ValueError(
                f"{key}.fetch_aware_dealing=true needs {key}.shard_dealing=by_need (it "
                "deals one global order by each rank's fetch speed), got "
                f"shard_dealing={self.shard_dealing.value}"
            )
        if self.cross_rank_grouping is True and not (self.by_need and self.join):
            raise ValueError(
                f"{key}.cross_rank_grouping=true needs {key}.shard_dealing=by_need and "
                f"{key}.join=true (it moves samples of one dealt order between ranks and "
                "runs every one), got "
                f"shard_dealing={self.shard_dealing.value}, join={self.join}"
            )

    @property
    def window_max_bytes(self) -> int | None:
        """``window_max_mib`` in bytes (``None``: no cap)."""
        return None if self.window_max_mib is None else int(self.window_max_mib * 2**20)

    @property
    def by_need(self) -> bool:
        """Samples are dealt by need from one global order."""
        return self.shard_dealing is ShardDealing.BY_NEED

    @property
    def deals_by_fetch_time(self) -> bool:
        """Dealing sees fetch time: ``fetch_aware_dealing``, where ``None`` means
        wherever it applies (``by_need``)."""
        if self.fetch_aware_dealing is None:
            return self.by_need
        return self.fetch_aware_dealing

    @property
    def groups_across_ranks(self) -> bool:
        """Rounds may group across ranks: ``cross_rank_grouping``, where ``None`` means
        wherever it applies (``by_need`` with ``join``)."""
        if self.cross_rank_grouping is None:
            return self.by_need and self.join
        return self.cross_rank_grouping
