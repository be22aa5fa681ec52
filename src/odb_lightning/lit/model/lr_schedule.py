"""The learning-rate schedule: linear warmup, then constant or a cosine that follows the
optimizer steps or, when the step count is unknown in advance, the samples seen."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from typing_extensions import override

from odb_lightning.core.checks import check_int, check_positive_int, enum_member


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


RUN_LENGTH_STATE = ("_length", "_progress")
"""What a :class:`WarmupSchedule` learns of the run at its start: never checkpointed, so a
resume measures the run it is in (a longer ``max_steps``, another sample count)."""


class WarmupSchedule(LambdaLR):
    """Linear warmup, then a cosine or constant learning rate (:func:`lr_factor`), by
    optimizer step: the ``model.scheduler`` node (``_partial_``), called with the
    optimizer.

    A cosine without ``decay_steps`` learns its length when training starts, from the
    module (:meth:`run_for` with the trainer's step estimate, or :meth:`follow` with the
    fraction of the planned samples seen: ODB epochs have no length before they run).

    Args:
        optimizer: The optimizer whose learning rates it scales.
        shape: ``cosine`` or ``constant`` after the warmup.
        warmup_steps: Optimizer steps of linear warmup.
        min_lr_ratio: Final learning rate of the cosine as a fraction of the peak.
        decay_steps: Optimizer steps of warmup plus cosine; ``None``: learned at the start.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        shape: LRSchedule | str,
        warmup_steps: int,
        min_lr_ratio: float,
        decay_steps: int | None,
    ) -> None:
        check_int("model.scheduler.warmup_steps", warmup_steps, least=0)
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"model.scheduler.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        check_positive_int("model.scheduler.decay_steps", decay_steps, optional=True)
        schedule = enum_member(LRSchedule, "model.scheduler.shape", shape)
        # Plain values only: the state dict (these attributes) goes into checkpoints that
        # torch.load(weights_only=True) reads.
        self.shape, self.warmup_steps = schedule.value, warmup_steps
        self.min_lr_ratio, self.decay_steps = min_lr_ratio, decay_steps
        self._length: int | None = None
        self._progress: Callable[[], float] | None = None
        super().__init__(optimizer, lambda step: self.factor(step))

    @property
    def needs_length(self) -> bool:
        """A cosine whose length is neither configured nor learned yet."""
        known = self.decay_steps is not None or self._length is not None or self._progress
        return self.shape == LRSchedule.COSINE.value and not known

    def run_for(self, decay_steps: int) -> None:
        """Set the cosine's length in optimizer steps (the trainer's estimate)."""
        self._length = decay_steps

    def follow(self, progress: Callable[[], float]) -> None:
        """Let the cosine follow ``progress()``, the fraction of the run done."""
        self._progress = progress

    def factor(self, step: int) -> float:
        """The multiplier of the peak learning rate at optimizer step ``step``."""
        if self.needs_length and step > 0:
            raise RuntimeError(
                "the cosine's length is learned when training starts (on_train_start): "
                "set model.scheduler.decay_steps to step the schedule outside a trainer"
            )
        # Step 0 (LambdaLR's first call) needs no length: the warmup, or the cosine's top.
        return lr_factor(
            step,
            warmup_steps=self.warmup_steps,
            decay_steps=self.decay_steps or self._length or 0,
            min_lr_ratio=self.min_lr_ratio,
            schedule=LRSchedule(self.shape),
            progress=None if self._progress is None else self._progress(),
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for key in RUN_LENGTH_STATE:
            state.pop(key, None)
        return state
