"""Offline epoch plans for every batching mode, and their padding statistics.

:func:`plan_epoch` asks the configured policy for its plan (:mod:`~odb_lightning.core.policy`
for the planned modes, whose plans are in :mod:`~odb_lightning.core.plans`; the online
policy replays the runtime through the single-rank simulator, so the plan is what
production would emit for that arrival order); :func:`~odb_lightning.core.plans.summarize_plan`
measures a plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.plans import validate_lengths
from odb_lightning.core.simulate import simulate


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
