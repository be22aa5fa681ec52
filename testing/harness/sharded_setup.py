"""Lightning's setup under FSDP2 on 2 CPU ranks, stopped before the first batch: what a
module looks like once ``configure_model`` has built, sharded and materialized it."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from odb_lightning.lit.model.fsdp2 import FSDP2Strategy


def one_batch_loader() -> DataLoader:
    """A ``train_dataloader`` for a setup-only fit (no batch of it is ever trained)."""
    return DataLoader([torch.zeros(1)])


def fit_setup_only(module: pl.LightningModule, devices: int = 2) -> None:
    """``trainer.fit(module)`` under ``FSDP2Strategy`` (gloo) with no training batch: the
    module's ``on_fit_start`` sees it set up; run it on every rank (torchrun)."""
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=FSDP2Strategy(process_group_backend="gloo"),
        limit_train_batches=0,
        limit_val_batches=0,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
