"""The progress bar (``lit/callbacks/progress.py``) in a real fit: the step total of a planned epoch
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
from lightning.pytorch.callbacks import ModelCheckpoint

from odb_lightning.core.config import BatchingConfig
from odb_lightning.lit.callbacks.counters import StepCounters
from odb_lightning.lit.callbacks.progress import (
    ESTIMATE_AFTER_SHARE,
    ODBProgressBar,
    SteadyRateTqdm,
)
from odb_lightning.lit.callbacks.step_metrics import StepMetricsCallback
from odb_lightning.lit.data.datamodule import ODBDataModule
from odb_lightning.lit.run_context import RunContext

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
        self.rounds: list[int] = []
        self.rate_clock_steps: list[int | None] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        bar = self.train_progress_bar
        self.seen.append((bar.n, bar.total, bar.postfix or ""))
        self.samples.append(0 if batch.meta.is_idle else batch.meta.local_samples)
        self.rounds.append(batch.meta.round_index)
        assert isinstance(bar, SteadyRateTqdm)
        self.rate_clock_steps.append(bar.rate_clock_steps)


def fit(
    tmp_path: Path, mode: str, ckpt_path: Path | None = None, **limits: Any
) -> tuple[RecordingBar, ODBDataModule]:
    """A fit of ``NUM_TRAIN`` samples; with ``checkpoint_every`` in ``limits``, a checkpoint
    ``step=S.ckpt`` in ``tmp_path`` every that many steps; resumed from ``ckpt_path``."""
    every = limits.pop("checkpoint_every", None)
    saving = [] if every is None else [checkpoint_every(tmp_path, every)]
    batching = BatchingConfig.of(
        mode=mode,
        batch_size=BATCH_SIZE,
        token_budget=4096,
        outstanding_depth=16,
        num_workers=0,
    )
    run = RunContext()
    datamodule = ODBDataModule.of(
        SimpleNamespace(pad_id=0),
        batching,
        name="synthetic",
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
        callbacks=[counters, StepMetricsCallback(counters=counters), bar, *saving],
        logger=False,
        enable_checkpointing=bool(saving),
        enable_model_summary=False,
        **limits,
    )
    trainer.fit(OneWeight(), datamodule=datamodule, ckpt_path=ckpt_path)
    return bar, datamodule


def checkpoint_every(directory: Path, steps: int) -> ModelCheckpoint:
    return ModelCheckpoint(
        dirpath=directory, filename="{step}", every_n_train_steps=steps, save_top_k=-1
    )


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


def test_odb_total_is_estimated_once_and_ends_on_the_real_count(tmp_path: Path) -> None:
    """The estimate is set once, when a round ends with a tenth of the rank's 32 samples
    emitted (the ended rounds' steps for their samples, scaled to 32), and moves again only
    if the steps pass it (from every step so far); the epoch ends on the real count."""
    bar, _ = fit(tmp_path, "odb", max_epochs=1)
    steps = len(bar.seen)
    assert steps > 1 and sum(bar.samples) == NUM_TRAIN
    assert len(set(bar.rounds)) >= 2, "the case needs several rounds"
    expected: int | None = None
    for k, (n, total, _) in enumerate(bar.seen, start=1):
        emitted = sum(bar.samples[: k - 1])
        opens_round = k > 1 and bar.rounds[k - 1] != bar.rounds[k - 2]
        first = expected is None and emitted >= ESTIMATE_AFTER_SHARE * NUM_TRAIN
        if opens_round and (first or (expected is not None and n > expected)):
            expected = max(n, math.ceil((k - 1) * NUM_TRAIN / emitted))
        if expected is not None and n > expected:  # passed: once more, from every step
            expected = max(n, math.ceil(k * NUM_TRAIN / sum(bar.samples[:k])))
        assert total == expected, f"step {k}"
    assert bar.seen[0][1] is None, "unknown until a tenth of the samples is in"
    totals = [total for _, total, _ in bar.seen[:-1] if total is not None]
    assert totals and len(set(totals)) <= 2, f"the total moved with the rounds: {bar.seen}"
    assert bar.train_progress_bar.total == steps == bar.train_progress_bar.n
    assert "tok/s=" in bar.seen[0][2]


@pytest.mark.parametrize("mode", ["standard", "odb"])
def test_a_resumed_epoch_keeps_its_total(mode: str, tmp_path: Path) -> None:
    """Lightning skips ``on_train_epoch_start`` on a resume inside an epoch; the bar still
    has a total from the first resumed step: the steps done plus the resumed plan's, or
    the online estimate the checkpoint saved."""
    first, _ = fit(tmp_path, mode, max_epochs=1, max_steps=7, checkpoint_every=5)
    resumed, _ = fit(tmp_path / "resumed", mode, tmp_path / "step=5.ckpt", max_epochs=1)
    assert [n for n, _, _ in resumed.seen] == list(range(6, 6 + len(resumed.seen)))
    assert all(total is not None for _, total, _ in resumed.seen), resumed.seen
    total_at_save = first.seen[4][1]
    if mode == "standard":
        assert resumed.seen[0][1] == NUM_TRAIN // BATCH_SIZE  # 5 done + the 3 planned left
    else:
        assert resumed.seen[0][1] == max(6, total_at_save)
    assert resumed.train_progress_bar.total == resumed.seen[-1][0] == resumed.train_progress_bar.n
    assert resumed.train_progress_bar.desc.startswith("Epoch 0")


@pytest.mark.parametrize("mode", ["standard", "odb"])
def test_bar_redraws_every_step(mode: str, tmp_path: Path) -> None:
    bar, _ = fit(tmp_path, mode, max_epochs=1)
    assert [n for n, _, _ in bar.seen] == list(range(1, len(bar.seen) + 1))
    # The rate (and ETA) counts from the end of the first step on.
    assert bar.rate_clock_steps == [1] * len(bar.seen)
