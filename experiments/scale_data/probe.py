"""A Lightning callback that records when a ``train.py`` run reached each start-up mark.

Added to a run from the command line, through the public ``callbacks`` group::

    python train.py ... +callbacks.scale_probe._target_=experiments.scale_data.probe.StartupProbe \\
        +callbacks.scale_probe.output_dir=<run dir>

Each rank writes ``startup_rank{r}.json``: wall-clock times (``time.time()``) of its
process start, ``fit_start``, ``train_start``, ``first_batch_requested`` (the first
training epoch starts: Lightning asks the loader for batches next), ``first_batch`` (batch
0 reached the training step), ``first_step`` (batch 0's optimizer step is done) and
``train_end``, and how many training batches ran.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import psutil
from typing_extensions import override


class StartupProbe(pl.Callback):
    """Start-up marks of one rank (first occurrence of each), written at the first step
    and again at the end of training."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.marks: dict[str, float] = {"process_start": psutil.Process().create_time()}
        self.batches = 0

    def _mark(self, name: str) -> None:
        self.marks.setdefault(name, time.time())

    def _write(self, trainer: pl.Trainer) -> None:
        path = self.output_dir / f"startup_rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"marks": self.marks, "batches": self.batches}))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("fit_start")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("train_start")

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("first_batch_requested")

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._mark("first_batch")

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.batches += 1
        if "first_step" not in self.marks:
            self._mark("first_step")
            self._write(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark("train_end")
        self._write(trainer)
