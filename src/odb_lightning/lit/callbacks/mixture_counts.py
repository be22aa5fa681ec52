"""What each part of a mixture (``data.mixture``) trained: samples and tokens by part,
every rank's, kept across a resume; in ``summary.json`` as ``mixture_trained``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import numpy as np
from typing_extensions import override

from odb_lightning.data.mixture import MixedRecords
from odb_lightning.lit.callbacks.rank_gather import gather_rows, own_rank_entry
from odb_lightning.lit.callbacks.step_end import StepEndCallback


class MixtureCounts(StepEndCallback):
    """Counts the samples and tokens (their lengths) each part trained on this rank.

    Args:
        records: The data module's mixed records (known after its ``setup``).
    """

    def __init__(self, records: Callable[[], MixedRecords | None]) -> None:
        self.records = records
        self.samples: np.ndarray | None = None
        self.tokens: np.ndarray | None = None
        self._trainer: pl.Trainer | None = None
        self._loaded: dict[str, Any] | None = None

    def _mixed(self) -> MixedRecords:
        mixed = self.records()
        if mixed is None:
            raise RuntimeError("MixtureCounts counts a mixture: the data module has none")
        if self.samples is None:
            self.samples = np.zeros(len(mixed.parts), dtype=np.int64)
            self.tokens = np.zeros(len(mixed.parts), dtype=np.int64)
        return mixed

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict() gathers every rank's counts

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mixed()
        if self._loaded is not None:  # a resume: this rank's counts of the checkpoint
            self.samples = np.asarray(self._loaded["samples"], dtype=np.int64)
            self.tokens = np.asarray(self._loaded["tokens"], dtype=np.int64)
            self._loaded = None

    @override
    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        meta = batch.meta
        if meta.is_idle:
            return
        mixed = self._mixed()
        parts = mixed.part_of(meta.sample_ids)
        assert self.samples is not None and self.tokens is not None
        np.add.at(self.samples, parts, 1)
        np.add.at(self.tokens, parts, np.asarray(meta.sample_lengths, dtype=np.int64))

    def _gather(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[list[float]]:
        self._mixed()
        assert self.samples is not None and self.tokens is not None
        row = [*map(float, self.samples), *map(float, self.tokens)]
        return gather_rows(trainer, pl_module, row)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Every rank's counts by part (a collective)."""
        trainer = self._trainer
        if trainer is None or trainer.lightning_module is None or self.records() is None:
            return {}
        rows = self._gather(trainer, trainer.lightning_module)
        half = len(rows[0]) // 2
        return {
            "per_rank": [
                {"samples": [int(v) for v in r[:half]], "tokens": [int(v) for v in r[half:]]}
                for r in rows
            ]
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._loaded = own_rank_entry(state_dict["per_rank"], self._trainer, "mixture counts")

    def summary_entries(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """``mixture_trained``: each part's samples and tokens over every rank, and its
        share of the samples (every rank calls it: one gather)."""
        labels = self._mixed().labels
        rows = np.asarray(self._gather(trainer, pl_module), dtype=np.int64).sum(axis=0)
        samples, tokens = rows[: len(labels)], rows[len(labels) :]
        total = int(samples.sum())
        return {
            "mixture_trained": {
                label: {
                    "samples": int(s),
                    "tokens": int(t),
                    "share": int(s) / total if total else None,
                }
                for label, s, t in zip(labels, samples, tokens, strict=True)
            }
        }
