"""The progress bar (``lit/progress.py``) in a real fit: the step total of a planned epoch
from its first step, an ODB estimate that ends on the real count, and tokens/s and
samples/s in the bar from the first step.

A one-parameter module keeps each fit to about a second; the data module is the real one
(synthetic source, in-process loaders).
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from odb_lightning.core.config import BatchingConfig
from odb_lightning.lit.counters import StepCounters
from odb_lightning.lit.datamodule import ODBDataModule
from odb_lightning.lit.progress import ODBProgressBar, SteadyRateTqdm
from odb_lightning.lit.run_context import RunContext
from odb_lightning.lit.step_metrics import StepMetricsCallback

NUM_TRAIN = 32
BATCH_SIZE = 4


class OneWeight(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self.weight - 1).pow(2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RecordingBar(ODBProgressBar):
    """Records, after each step's update, the bar's position, total and postfix."""

    def __init__(self, run: RunContext) -> None:
        super().__init__(refresh_rate=1, train_samples=run.train_samples)
        self.seen: list[tuple[int, int | None, str]] = []
        self.samples: list[int] = []
        self.rate_clock_steps: list[int | None] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        bar = self.train_progress_bar
        self.seen.append((bar.n, bar.total, bar.postfix or ""))
        self.samples.append(0 if batch.meta.is_idle else batch.meta.local_samples)
        assert isinstance(bar, SteadyRateTqdm)
        self.rate_clock_steps.append(bar.rate_clock_steps)


def fit(tmp_path: Path, mode: str, **limits: Any) -> tuple[RecordingBar, ODBDataModule]:
    batching = BatchingConfig.of(
        mode=mode,
        batch_size=BATCH_SIZE,
        token_budget=4096,
        outstanding_depth=16,
        num_workers=0,
    )
    run = RunContext(max_seq_len=1024)
    datamodule = ODBDataModule(
        "synthetic",
        SimpleNamespace(pad_id=0),
        batching,
        regime="sharegpt_first_exchange",
        max_seq_len=1024,
        max_samples=NUM_TRAIN,
        val_samples=0,
        run=run,
    )
    bar = RecordingBar(run)
    counters = StepCounters()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        # As the app orders them: the counters count, the metrics log, then the bar draws.
        callbacks=[counters, StepMetricsCallback(counters=counters), bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **limits,
    )
    trainer.fit(OneWeight(), datamodule=datamodule)
    return bar, datamodule


def test_planned_epoch_has_its_total_and_rates_from_the_first_step(tmp_path: Path) -> None:
    bar, _ = fit(tmp_path, "standard", max_epochs=1)
    steps = NUM_TRAIN // BATCH_SIZE
    assert [(n, total) for n, total, _ in bar.seen] == [(n, steps) for n in range(1, steps + 1)]
    first_postfix = bar.seen[0][2]
    assert "tok/s=" in first_postfix and "samples/s=" in first_postfix
    assert "v_num" not in first_postfix


def test_planned_total_is_capped_by_max_steps(tmp_path: Path) -> None:
    bar, _ = fit(tmp_path, "standard", max_epochs=-1, max_steps=3)
    assert [(n, total) for n, total, _ in bar.seen] == [(1, 3), (2, 3), (3, 3)]


def test_odb_total_is_an_estimate_from_samples_that_ends_on_the_real_count(
    tmp_path: Path,
) -> None:
    bar, _ = fit(tmp_path, "odb", max_epochs=1)
    steps = len(bar.seen)
    assert steps > 1 and sum(bar.samples) == NUM_TRAIN
    # After k steps: k steps for the samples emitted so far, scaled to the rank's 32.
    for k, (n, total, _) in enumerate(bar.seen, start=1):
        assert total == max(n, math.ceil(k * NUM_TRAIN / sum(bar.samples[:k])))
    assert bar.train_progress_bar.total == steps == bar.train_progress_bar.n
    assert "tok/s=" in bar.seen[0][2]


@pytest.mark.parametrize("mode", ["standard", "odb"])
def test_bar_redraws_every_step(mode: str, tmp_path: Path) -> None:
    bar, _ = fit(tmp_path, mode, max_epochs=1)
    assert [n for n, _, _ in bar.seen] == list(range(1, len(bar.seen) + 1))
    # The rate (and ETA) counts from the end of the first step on.
    assert bar.rate_clock_steps == [1] * len(bar.seen)
