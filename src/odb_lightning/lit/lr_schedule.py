"""The learning-rate schedule: linear warmup, then constant or a cosine that follows the
optimizer steps or, when the step count is unknown in advance, the samples seen."""

from __future__ import annotations

import math
from enum import StrEnum


class LRSchedule(StrEnum):
    """Learning-rate shape after the linear warmup."""

    COSINE = "cosine"
    CONSTANT = "constant"


def lr_factor(
    step: int,
    warmup_steps: int,
    decay_steps: int,
    min_lr_ratio: float,
    schedule: LRSchedule,
    progress: float | None = None,
) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (step 0 already trains at ``1 / warmup_steps``),
    then either constant, or a cosine from 1 down to ``min_lr_ratio`` reached at
    ``decay_steps`` and held after it. With ``progress`` (the fraction of the run done,
    e.g. samples seen / samples planned) the cosine follows it instead of the step count.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule is LRSchedule.CONSTANT:
        return 1.0
    if progress is None:
        progress = (step - warmup_steps) / max(1, decay_steps - warmup_steps)
    progress = min(1.0, progress)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
