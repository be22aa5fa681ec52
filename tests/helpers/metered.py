"""A minimal LightningModule with a decoder's configuration and ODB batches of chosen
sample lengths, for the step-metrics callback (no real model: its FLOPs model reads the
configuration only, and the batches' metadata carries every count it uses)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from transformers import Qwen2Config
from typing_extensions import override

from odb_lightning.core.rows import PaddedRows
from odb_lightning.runtime.batch import ODBBatch, build_step_meta

CONFIG = Qwen2Config(
    vocab_size=1000,
    hidden_size=8,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=16,
)


class Decoder(nn.Module):
    """A parameter to train and the configuration the FLOPs model reads."""

    def __init__(self) -> None:
        super().__init__()
        self.config = CONFIG
        self.weight = nn.Parameter(torch.ones(1))


class MeteredModule(pl.LightningModule):
    """Trains one parameter on the batches' token count; ``step_sleep_s`` makes each step
    take at least that long (a slower rank)."""

    def __init__(self, step_sleep_s: float = 0.0) -> None:
        super().__init__()
        self.model = Decoder()
        self.step_sleep_s = step_sleep_s

    @override
    def training_step(self, batch: ODBBatch, batch_idx: int) -> Tensor:
        time.sleep(self.step_sleep_s)
        return (self.model.weight * batch.inputs["input_ids"].float().sum()).sum() * 0.0

    @override
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def metered_batches(steps: Sequence[Sequence[int] | None], loss_share: int = 2) -> list[ODBBatch]:
    """One ODB batch per entry: samples of those lengths (``None``: IDLE), each with
    ``length // loss_share`` supervised tokens."""
    batches = []
    for k, lengths in enumerate(steps):
        lengths = list(lengths or ())
        ids = list(range(100 * k, 100 * k + len(lengths)))
        meta = build_step_meta(
            ids,
            lengths,
            sum(n // loss_share for n in lengths),
            rows=PaddedRows(),
            global_samples=len(lengths),
            global_loss_tokens=None,
            round_index=0,
            step=k,
            epoch=0,
        )
        inputs = {"input_ids": torch.ones((max(1, len(lengths)), max(lengths, default=1)))}
        batches.append(ODBBatch(inputs, meta))
    return batches
