"""A callback that writes timestamped marks of a run's phases, one line per event, for
``experiments/stop_phases/run.py`` and the stop tests of ``tests/integration/
test_train_faults.py``: every step boundary, validation starts, checkpoint saves, the end
of training and the teardown, each with the rank and ``time.time()``.

Added to a run with ``+callbacks.stop_marks._target_=testing.harness.stop_marks.StopMarks
+callbacks.stop_marks.path=<file>``; each rank appends to ``<file>.rank<r>``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


class StopMarks(Callback):
    """Appends ``{"event", "rank", "step", "t"}`` lines (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._file: Any = None

    def _mark(self, trainer: pl.Trainer, event: str) -> None:
        if self._file is None:
            target = Path(f"{self._path}.rank{trainer.global_rank}")
            target.parent.mkdir(parents=True, exist_ok=True)
            self._file = target.open("a", buffering=1)
        record = {"event": event, "rank": trainer.global_rank, "step": trainer.global_step}
        record.update(t=time.time(), pid=os.getpid())
        self._file.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(trainer, "train_start")

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._mark(trainer, "step_end")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(trainer, "validation_start")

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any) -> None:
        self._mark(trainer, "save_checkpoint")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(trainer, "train_end")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._mark(trainer, "teardown")
