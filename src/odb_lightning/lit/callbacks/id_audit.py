"""The id audit: which records every training step of this rank emitted, one line per
step, so that a run can be checked to have trained each record once per epoch."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from odb_lightning.lit.callbacks.step_end import StepEndCallback
from odb_lightning.lit.run_files import open_run_file

RecordIds = Callable[[list[int]], Sequence[Any]]
"""The source's own ids of the records at some dataset indices
(:meth:`~odb_lightning.lit.data.datamodule.ODBDataModule.record_ids`)."""


class IdAudit(StepEndCallback):
    """Writes ``emitted_ids_rank{r}.jsonl``: one line per training step,
    ``{"ids": [...], "indices": [...]}``, the records' own ids and their dataset indices,
    both ``[]`` for IDLE. A resumed run appends to the file of the run it resumes.

    Args:
        output_dir: Directory of the run.
        enabled: Write the audit (``audit_ids``); ``False`` writes nothing.
        record_ids: The records' ids of dataset indices (the app gives the data module's);
            ``None``: the indices themselves.
    """

    def __init__(
        self, output_dir: str, enabled: bool = False, record_ids: RecordIds | None = None
    ) -> None:
        self.output_dir = Path(output_dir)
        self.enabled = enabled
        self.record_ids = record_ids
        self._steps = 0
        self._resumed = False
        self._file: Any = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self._steps} if self.enabled else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed = bool(state_dict)
        self._steps = int(state_dict.get("steps", 0))

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / f"emitted_ids_rank{trainer.global_rank}.jsonl"
        self._file = open_run_file(path, "a" if self._resumed else "w")

    @override
    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        if self._file is None:
            return
        indices = [int(i) for i in batch.meta.sample_ids]
        ids = list(self.record_ids(indices)) if self.record_ids is not None else indices
        self._file.write(json.dumps({"ids": ids, "indices": indices}) + "\n")
        self._file.flush()  # a killed run keeps every completed step's line
        self._steps += 1

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
