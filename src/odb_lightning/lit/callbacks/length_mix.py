"""How mixed in length each optimizer step's samples are.

Grouping keeps samples of nearly one length together, which is what saves padding; an
optimizer step made of one or two such groups (token-target steps, gradient accumulation)
then trains on samples of nearly one length, the curriculum the paper warns against. The
figure is the coefficient of variation (standard deviation over mean) of the lengths of
the samples one optimizer step trains on, on this rank: every micro-batch of the step,
IDLE ones contributing none. Fixed batches of a shuffled epoch mix lengths (ShareGPT
first exchanges: about 0.7); one ODB group alone holds nearly one length (about 0.01).

Logged per optimizer step as ``train/step_length_cv`` (rank 0's), and in ``summary.json``
as ``step_length_cv``: the mean over every rank's optimizer steps that trained at least two
samples (``None`` when none did), the steps of this process (a resumed run counts the steps
it ran).
"""

from __future__ import annotations

import statistics
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from odb_lightning.lit.callbacks.rank_gather import gather_rows


def length_cv(lengths: list[int]) -> float | None:
    """Population standard deviation over mean of ``lengths`` (``None`` below 2)."""
    if len(lengths) < 2:
        return None
    return statistics.pstdev(lengths) / statistics.fmean(lengths)


class StepLengthMix(pl.Callback):
    """The within-step length CV of every optimizer step (see the module docstring)."""

    def __init__(self) -> None:
        self._lengths: list[int] = []
        self._sum, self._steps = 0.0, 0

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        meta = batch.meta
        if not meta.is_idle:
            self._lengths.extend(meta.sample_lengths)

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        cv = length_cv(self._lengths)
        self._lengths = []
        if cv is None:
            return
        self._sum += cv
        self._steps += 1
        pl_module.log("train/step_length_cv", cv, on_step=True, on_epoch=False, rank_zero_only=True)

    def summary_entries(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """``step_length_cv`` over every rank's steps (every rank calls it: one gather)."""
        rows = gather_rows(trainer, pl_module, [self._sum, float(self._steps)])
        total, steps = sum(r[0] for r in rows), sum(r[1] for r in rows)
        return {"step_length_cv": total / steps if steps else None}
