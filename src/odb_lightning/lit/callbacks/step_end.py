"""The callbacks that act when a training step's batch is done, on its batch alone."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from typing_extensions import override


class StepEndCallback(pl.Callback):
    """A callback whose work at the end of each training batch needs the trainer, the
    module and the batch (its ``meta``): it writes :meth:`on_step_end` instead of
    Lightning's five-argument hook."""

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.on_step_end(trainer, pl_module, batch)

    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        """The batch ``batch`` of the training step just done."""
