"""Offline epoch plans for every batching mode, and their padding statistics.

:func:`plan_epoch` asks the configured policy for its plan (:mod:`~odb_lightning.core.policy`
for the planned modes, whose plans are in :mod:`~odb_lightning.core.plans`; the online
policy replays the runtime through the single-rank simulator, so the plan is what
production would emit for that arrival order). :func:`summarize_plan` measures a plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.plans import validate_lengths
from odb_lightning.core.rows import PaddedRows, RowLayout
from odb_lightning.core.simulate import simulate


@dataclass(frozen=True, slots=True)
class PlanStats:
    """Padding statistics of one epoch plan.

    Attributes:
        steps: Non-empty batches.
        mean_batch_size: Samples per step.
        padding_efficiency: Real tokens / padded tokens (1.0 for padding-free rows).
        budget_fill: Mean padded tokens per step / ``token_budget``; above 1 when a mode
            that ignores the budget (``standard``, ``sorted``) overshoots it.
        over_budget_samples: Samples that alone cost more than the budget.
        over_budget_batches: Multi-sample batches that cost more than the budget.
        real_tokens: Sum of sample lengths.
        padded_tokens: Sum over batches of the layout's padded tokens (``size * longest``
            for padded rows).
    """

    steps: int
    mean_batch_size: float
    padding_efficiency: float
    budget_fill: float
    over_budget_samples: int
    over_budget_batches: int
    real_tokens: int
    padded_tokens: int


def plan_epoch(
    lengths: Sequence[int],
    config: BatchingConfig | None = None,
    *,
    epoch: int = 0,
    **knobs: object,
) -> list[list[int]]:
    """Plan one epoch on one rank with ``config``'s policy: a planned policy's own
    ``plan_epoch`` (:mod:`~odb_lightning.core.policy`), or the online runtime replayed by
    the single-rank simulator.

    Args:
        lengths: Token length of every sample (positive integers).
        config: The batching settings.
        epoch: Epoch number; changes every shuffle.
        **knobs: Settings by their field names (``mode``, ``token_budget``, any field of
            a concern) that replace those of ``config`` (:meth:`BatchingConfig.of`).

    Returns:
        Batches of indices into ``lengths``, each index exactly once, in emission order.

    Raises:
        ValueError: Naming the sample index of a bad length, or a bucketed plan without
            boundaries.
    """
    config = BatchingConfig.of(config, **knobs)
    validate_lengths(lengths)
    if config.policy.online:
        return _replay_online(lengths, config, epoch)
    return config.policy.plan_epoch(lengths, config.budget, config.seed, epoch)


def _replay_online(lengths: Sequence[int], config: BatchingConfig, epoch: int) -> list[list[int]]:
    """The online policy's plan: the single-rank simulator over the epoch permutation."""
    order = epoch_permutation(len(lengths), config.seed, epoch)
    (steps,) = simulate([[lengths[i] for i in order]], config, epoch=epoch)
    # One rank never idles: T never exceeds its own group count.
    return [[order[j] for j in step] for step in steps]


PADDED = PaddedRows()
"""The default layout of :func:`summarize_plan`: padded rows, no rounding, tokens only."""


def summarize_plan(
    lengths: Sequence[int],
    batches: Sequence[Sequence[int]],
    token_budget: int,
    *,
    rows: RowLayout = PADDED,
) -> PlanStats:
    """Padding statistics of ``batches`` (indices into ``lengths``) against the budget of
    the row layout ``rows`` (whose padded tokens they count).

    Empty (IDLE) batches are not steps and are skipped.
    """
    budget = rows.budget(token_budget)
    steps = samples = real = padded = over_samples = over_batches = 0
    for batch in batches:
        if not batch:
            continue
        batch_lengths = [lengths[i] for i in batch]
        steps += 1
        samples += len(batch)
        real += sum(batch_lengths)
        padded += rows.padded_tokens(batch_lengths)
        over_samples += sum(budget.is_over_budget(n) for n in batch_lengths)
        over_batches += len(batch) > 1 and budget.group_cost(batch_lengths) > token_budget
    return PlanStats(
        steps=steps,
        mean_batch_size=samples / steps if steps else 0.0,
        padding_efficiency=real / padded if padded else 1.0,
        budget_fill=padded / steps / token_budget if steps else 0.0,
        over_budget_samples=over_samples,
        over_budget_batches=over_batches,
        real_tokens=real,
        padded_tokens=padded,
    )
