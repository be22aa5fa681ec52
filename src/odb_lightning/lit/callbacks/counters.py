"""Each rank's counts of the steps it trained: samples, tokens, IDLE steps, loader wait,
step costs and the training wall time, kept across a resume.

Counts come from each batch's step metadata, so the run's figures are emitted samples
over wall time, never ``batch_size x steps``. (Lightning's ``ThroughputMonitor``
multiplies one device's rate by the world size, which is wrong when ranks emit different
batch sizes, as they do here.) The step metrics log rates from these counts and the
summary builder sums them over ranks.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from odb_lightning.lit.callbacks.rank_gather import Counts, own_rank_entry
from odb_lightning.lit.callbacks.step_end import StepEndCallback


@dataclass
class RankTotals(Counts):
    """Counters of one rank, summed over the run."""

    steps: int = 0
    idle_steps: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    loss_tokens: int = 0
    loader_wait_s: float = 0.0
    max_cost: int = 0  # sum over steps of the slowest rank's cost (equal on every rank)
    cost_over_max: float = 0.0  # sum over steps of (cost over all ranks) / (slowest one's)
    costed_steps: int = 0
    useful_cost: int = 0

    def add(self, meta: Any, wait_s: float) -> None:
        self.steps += 1
        self.loader_wait_s += wait_s
        if meta.step_max_cost:
            self.max_cost += meta.step_max_cost
            self.cost_over_max += meta.step_cost_sum / meta.step_max_cost
            self.costed_steps += 1
            self.useful_cost += meta.local_useful_cost or 0
        if meta.is_idle:
            self.idle_steps += 1
            return
        self.samples += meta.local_samples
        self.real_tokens += meta.local_real_tokens
        self.padded_tokens += meta.local_padded_tokens
        self.loss_tokens += meta.local_loss_tokens


class StepCounters(StepEndCallback):
    """Counts every training step of this rank from its metadata (:class:`RankTotals`) and
    the training wall time (epochs from their start to their last batch).

    The counters are part of a checkpoint (every rank's, with the wall time), so a resumed
    run's step, sample and token counts cover the whole run.
    """

    def __init__(self) -> None:
        self.totals = RankTotals()
        self._train_s = 0.0
        self._epoch_start: float | None = None
        self._last_batch_end: float | None = None
        self._wait_s = 0.0
        self._trainer: pl.Trainer | None = None

    @property
    def train_s(self) -> float:
        """Training wall time of the finished epochs (and of the run resumed)."""
        return self._train_s

    def _train_s_so_far(self) -> float:
        """:attr:`train_s` and the open epoch up to its last batch."""
        if self._epoch_start is None or self._last_batch_end is None:
            return self._train_s
        return self._train_s + self._last_batch_end - self._epoch_start

    def elapsed_s(self) -> float:
        """Training wall time up to now (the open epoch up to this moment)."""
        return self._train_s + time.perf_counter() - (self._epoch_start or 0.0)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict() gathers every rank's counters

    @override
    def state_dict(self) -> dict[str, Any]:
        """Every rank's counters and the training wall time so far (a collective)."""
        trainer = self._trainer
        if trainer is None or trainer.lightning_module is None:
            return {}
        per_rank = self.totals.gather(trainer, trainer.lightning_module)
        return {"per_rank": [asdict(r) for r in per_rank], "train_s": self._train_s_so_far()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        own = own_rank_entry(state_dict["per_rank"], self._trainer, "counters")
        if own is None:
            return
        self.totals = RankTotals(**own)
        self._train_s = float(state_dict["train_s"])

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A run resumed mid-epoch gets no on_train_epoch_start for that epoch.
        self._epoch_start = self._last_batch_end = time.perf_counter()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = self._last_batch_end = time.perf_counter()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._wait_s = now - (self._last_batch_end or now)

    @override
    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        self.totals.add(batch.meta, self._wait_s)
        self._last_batch_end = time.perf_counter()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_s = self._train_s_so_far()
        self._epoch_start = None
