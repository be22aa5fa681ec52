"""The within-step length CV: every micro-batch of an optimizer step counted, IDLE ones
adding nothing, and the summary's mean over every rank's steps."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
import torch

from odb_lightning.lit.callbacks.length_mix import StepLengthMix, length_cv


def batch(*lengths: int, idle: bool = False) -> SimpleNamespace:
    return SimpleNamespace(meta=SimpleNamespace(is_idle=idle, sample_lengths=lengths))


class Module:
    """What the callback uses of a LightningModule: ``log`` and ``device``."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.logged: list[float] = []

    def log(self, name: str, value: float, **kwargs: object) -> None:
        assert name == "train/step_length_cv" and kwargs["rank_zero_only"] is True
        self.logged.append(value)


def test_one_optimizer_step_counts_every_micro_batch_and_skips_idle_ones() -> None:
    mix, module = StepLengthMix(), Module()
    trainer = SimpleNamespace(strategy=SimpleNamespace(all_gather=lambda t: t))
    # Step 1: two groups of one length each (a token-target step of two ODB groups).
    mix.on_train_batch_start(trainer, module, batch(10, 10), 0)
    mix.on_train_batch_start(trainer, module, batch(0, idle=True), 1)
    mix.on_train_batch_start(trainer, module, batch(100, 100), 2)
    mix.on_before_optimizer_step(trainer, module, None)
    # Step 2: one group of one length; step 3: one sample alone (no CV, not counted).
    mix.on_train_batch_start(trainer, module, batch(50, 50, 50), 3)
    mix.on_before_optimizer_step(trainer, module, None)
    mix.on_train_batch_start(trainer, module, batch(70), 4)
    mix.on_before_optimizer_step(trainer, module, None)
    assert module.logged == [pytest.approx(45 / 55), 0.0]
    assert mix.summary_entries(trainer, module) == {"step_length_cv": pytest.approx(45 / 110)}


def test_the_summary_averages_over_every_ranks_steps() -> None:
    mix, module = StepLengthMix(), Module()
    # Two ranks: this one's (sum of CVs, steps), the other's (0.9 over 3 steps).
    gathered = SimpleNamespace(
        all_gather=lambda t: torch.stack([t, torch.tensor([0.9, 3.0], dtype=t.dtype)])
    )
    mix.on_train_batch_start(None, module, batch(10, 30), 0)
    mix.on_before_optimizer_step(None, module, None)
    (entry,) = mix.summary_entries(SimpleNamespace(strategy=gathered), module).values()
    assert entry == pytest.approx((0.5 + 0.9) / 4)
    assert length_cv([10, 30]) == pytest.approx(statistics.pstdev([10, 30]) / 20)
    assert length_cv([5]) is None
    empty = StepLengthMix().summary_entries(SimpleNamespace(strategy=SimpleNamespace(
        all_gather=lambda t: t)), module)  # fmt: skip
    assert empty == {"step_length_cv": None}
