"""Every rank's row of numbers, gathered: the one collective the run's counters, the step
metrics and the summary use, and :class:`Counts`, the type of the counts they gather."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Self

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn


def gather_rows(
    trainer: pl.Trainer, pl_module: pl.LightningModule, values: list[float]
) -> list[list[float]]:
    """``values`` of every rank, by rank (one all-gather; every rank must call it)."""
    local = torch.tensor(values, dtype=torch.float64, device=pl_module.device)
    return trainer.strategy.all_gather(local).reshape(-1, len(values)).cpu().tolist()


@dataclass
class Counts:
    """Counts of one rank that add up over steps and over ranks; a subclass declares them
    as fields with a default of their type (``0`` or ``0.0``)."""

    def add(self, other: Self) -> None:
        """Add ``other``'s counts to these, field by field."""
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def row(self) -> list[float]:
        """The counts as one row of floats, in field order (what :func:`gather_rows` sends)."""
        return [float(getattr(self, field.name)) for field in fields(self)]

    @classmethod
    def of_row(cls, row: Sequence[float]) -> Self:
        """The counts of a :meth:`row`, each back to the type of its field's default."""
        return cls(*(type(f.default)(v) for f, v in zip(fields(cls), row, strict=True)))

    def gather(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[Self]:
        """Every rank's counts, by rank (one all-gather; every rank must call it)."""
        return [self.of_row(row) for row in gather_rows(trainer, pl_module, self.row())]


def own_rank_entry(per_rank: Sequence[Any], trainer: pl.Trainer | None, what: str) -> Any | None:
    """This rank's entry of a checkpoint's every-rank state (``per_rank``, by rank), or
    ``None``, warned once naming ``what`` (``counters``), where the checkpoint was taken
    with another number of ranks: the counts then cover this run only."""
    if trainer is None or len(per_rank) != trainer.world_size:
        rank_zero_warn(
            f"checkpoint {what} are from {len(per_rank)} ranks, this run has "
            f"{trainer.world_size if trainer else '?'}: the summary counts this run only"
        )
        return None
    return per_rank[trainer.global_rank]
