"""Resume under Lightning's own loop rules, in process: every data epoch is emitted
exactly once and data epochs stay consecutive, whichever checkpoint a run resumes from
(mid-epoch, at an epoch's end, at the end of a run that ``max_steps`` cut short, inside a
gradient accumulation), epoch- or step-bounded.

A trivial one-parameter module keeps each fit to about a second; the data module is the
real one (synthetic source, in-process loaders).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from odb_lightning.core.config import BatchingConfig
from odb_lightning.lit.data.datamodule import ODBDataModule

NUM_TRAIN = 32


class RecordingModule(pl.LightningModule):
    """Records ``(data epoch, sample ids)`` of every trained batch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.trained: list[tuple[int, tuple[int, ...]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.trained.append((batch.meta.epoch, batch.meta.sample_ids))
        return (self.weight - 1).pow(2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _datamodule(mode: str) -> ODBDataModule:
    batching = BatchingConfig.of(
        mode=mode,
        batch_size=4,
        token_budget=4096,
        outstanding_depth=16,
        persistent_workers=False,
        num_workers=0,
    )
    return ODBDataModule.of(
        SimpleNamespace(pad_id=0),
        batching,
        name="synthetic",
        regime="sharegpt_first_exchange",
        max_seq_len=1024,
        max_samples=NUM_TRAIN,
        val_samples=0,
    )


def _fit(
    directory: Path,
    mode: str,
    *,
    ckpt_path: Path | None = None,
    every_n_train_steps: int | None = None,
    accumulate_grad_batches: int = 1,
    **limits: Any,
) -> tuple[RecordingModule, dict]:
    module = RecordingModule()
    checkpoint = ModelCheckpoint(
        dirpath=directory, every_n_train_steps=every_n_train_steps, save_last="link", save_top_k=1
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate_grad_batches,
        **limits,
    )
    trainer.fit(module, datamodule=_datamodule(mode), ckpt_path=ckpt_path)
    saved = torch.load(directory / "last.ckpt", weights_only=True)
    return module, saved


def _per_epoch(trained: list[tuple[int, tuple[int, ...]]]) -> dict[int, Counter[int]]:
    by_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    for epoch, ids in trained:
        by_epoch[epoch].update(ids)
    return dict(by_epoch)


SCENARIOS = {
    # name: (first fit, resumed fit)
    "mid_epoch": ({"max_steps": 5, "every_n_train_steps": 5}, {"max_epochs": 3}),
    "mid_second_epoch_step_bounded": (
        {"max_steps": 13, "every_n_train_steps": 13},
        {"max_steps": 24},
    ),
    "epoch_end_step_bounded": ({"max_epochs": 1}, {"max_steps": 24}),
    "epoch_end_epoch_bounded": ({"max_epochs": 1}, {"max_epochs": 3}),
    "run_end_after_max_steps": ({"max_steps": 5}, {"max_epochs": 3}),
    "inside_accumulation": (
        {"max_steps": 3, "every_n_train_steps": 3, "accumulate_grad_batches": 2},
        {"max_epochs": 2, "every_n_train_steps": 3, "accumulate_grad_batches": 2},
    ),
}


@pytest.mark.parametrize("mode", ["standard", "odb"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_data_epoch_once_and_consecutive(scenario: str, mode: str, tmp_path: Path) -> None:
    first_limits, second_limits = SCENARIOS[scenario]
    first, saved = _fit(tmp_path / "first", mode, **first_limits)
    consumed = set(saved["ODBDataModule"]["train"]["consumed_ids"])
    resumed_epoch = saved["ODBDataModule"]["train"]["epoch"]
    # What the checkpoint counts as consumed is exactly what the first fit trained on in
    # the epoch it resumes (the fetched-ahead batch is not).
    trained_there = [i for epoch, ids in first.trained if epoch == resumed_epoch for i in ids]
    assert sorted(trained_there) == sorted(consumed)
    second, _ = _fit(
        tmp_path / "second", mode, ckpt_path=tmp_path / "first" / "last.ckpt", **second_limits
    )
    before = [(e, ids) for e, ids in first.trained if e < resumed_epoch or set(ids) <= consumed]
    by_epoch = _per_epoch(before + second.trained)
    assert sorted(by_epoch) == list(range(len(by_epoch))), "data epochs are consecutive"
    # The rest of a resumed ODB epoch is grouped anew, so it may take a step more or less
    # than the uninterrupted epoch: a step-bounded run may then end inside its last data
    # epoch, which must hold no sample twice.
    last = max(by_epoch)
    if "max_steps" in second_limits and by_epoch[last] != Counter(range(NUM_TRAIN)):
        assert len(before) + len(second.trained) == second_limits["max_steps"]
        assert max(by_epoch.pop(last).values()) == 1, f"data epoch {last}: a sample twice"
    for epoch, counts in by_epoch.items():
        assert counts == Counter(range(NUM_TRAIN)), f"data epoch {epoch}: every sample once"


def test_checkpoint_inside_an_accumulation_counts_only_applied_batches(tmp_path: Path) -> None:
    """A resumed run's first save can fall inside a gradient accumulation (Lightning does
    not keep when it last saved): the batch whose gradient no step applied is not
    consumed."""
    _fit(
        tmp_path / "first",
        "standard",
        max_steps=3,
        every_n_train_steps=3,
        accumulate_grad_batches=2,
    )
    second, _ = _fit(
        tmp_path / "second",
        "standard",
        ckpt_path=tmp_path / "first" / "last.ckpt",
        max_steps=4,
        every_n_train_steps=3,
        accumulate_grad_batches=2,
    )
    (path,) = (tmp_path / "second").glob("*step=3*.ckpt")
    state = torch.load(path, weights_only=True)["ODBDataModule"]["train"]
    assert len(state["consumed_ids"]) == 6 * 4, "six applied batches of four"
