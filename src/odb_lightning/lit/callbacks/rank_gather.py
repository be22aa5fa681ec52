"""Every rank's row of numbers, gathered: the one collective the run's counters, the step
metrics and the summary use."""

from __future__ import annotations

import lightning.pytorch as pl
import torch


def gather_rows(
    trainer: pl.Trainer, pl_module: pl.LightningModule, values: list[float]
) -> list[list[float]]:
    """``values`` of every rank, by rank (one all-gather; every rank must call it)."""
    local = torch.tensor(values, dtype=torch.float64, device=pl_module.device)
    return trainer.strategy.all_gather(local).reshape(-1, len(values)).cpu().tolist()
