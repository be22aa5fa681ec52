"""Lightning's tqdm progress bar with the totals our loaders know.

Our train and validation loaders are plain iterables without ``__len__`` (an ODB epoch's
step count is known only at its end), so Lightning's bar shows ``0/?``. The planned modes
(``standard``, ``sorted``, ``bucketed``, ``oracle``) do know it: their loader has the
epoch's plan, and its ``len()`` is the bar's total, with tqdm's ETA. For the online
modes the total is an estimate, set once: at the first end of an alignment round after
which the ended rounds hold at least :data:`ESTIMATE_AFTER_SHARE` of this rank's share of
the epoch's training samples, the steps of those rounds times the share over the samples
they emitted. Taken between rounds, it counts whole windows; taken once, the total and
the ETA hold still instead of moving with every round (the window's ramp makes the first
rounds' steps the least full). Until then the total is unknown (``?``). It moves again
only if the steps pass it (re-estimated then from every step so far), and at the
epoch's end to the real count.

On a resume inside an epoch Lightning does not start the epoch again
(``on_train_epoch_start`` is skipped), so the bar sets itself up at the first resumed step:
a planned epoch's total is the steps done plus those its resumed plan has left, and an
online one continues the estimate from the counts the bar saved in the checkpoint.

The training bar's rate, and so its ETA, counts from the end of each epoch's first step
(:class:`SteadyRateTqdm`): the first step waits for the loaders to start and the window to
fill (the ramp's first round), which is no measure of the steps after it.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from typing_extensions import override

from odb_lightning.lit.run_context import TrainSampleCount

ESTIMATE_AFTER_SHARE = 0.1
"""The part of this rank's samples the ended rounds must hold before an online epoch's
step total is estimated (once)."""

BAR_NAMES = {
    "perf/real_tokens_per_s": "tok/s",
    "perf/samples_per_s": "samples/s",
    "perf/mfu": "MFU",
    "perf/tokens_per_s_per_device": "tok/s/dev",
    "train/loss": "loss",
    "val/loss": "val_loss",
}
"""Short names in the bar of the metrics logged with ``prog_bar=True``."""


class SteadyRateTqdm(Tqdm):
    """Lightning's tqdm bar whose rate (and ETA) counts from :meth:`start_rate_clock`.

    tqdm's rate is the steps over the time since the bar was reset, so a slow first step
    dominates it for a long time (a first step as long as 200 others makes the ETA 200
    times too long after it, and still twice too long 200 steps later). Once the clock is
    started the rate is the steps since then over the time since then, and unknown
    (``?``) until a step has ended after it; the elapsed time shown stays tqdm's.
    :meth:`reset` (each epoch) stops the clock.

    Args:
        clock: Seconds, monotonic (a fake one in tests).
    """

    def __init__(self, *args: Any, clock: Callable[[], float] = time.monotonic, **kwargs: Any):
        self._clock = clock
        self._rate_start: tuple[int, float] | None = None  # (steps, clock) when started
        super().__init__(*args, **kwargs)

    def start_rate_clock(self, steps: int) -> None:
        """Count the rate from now, when ``steps`` steps have ended."""
        self._rate_start = (steps, self._clock())

    @property
    def rate_clock_steps(self) -> int | None:
        """The steps that had ended when the rate clock started (``None``: not started)."""
        return None if self._rate_start is None else self._rate_start[0]

    @override
    def reset(self, total: float | None = None) -> None:
        self._rate_start = None
        super().reset(total)

    @property
    @override
    def format_dict(self) -> dict[str, Any]:
        figures = super().format_dict
        if self._rate_start is not None:
            steps, started = self._rate_start
            seconds = self._clock() - started
            # tqdm shows "?" for a rate of 0 (and computes its own for None).
            figures["rate"] = (self.n - steps) / seconds if self.n > steps and seconds else 0
        return figures


def planned_steps(loader: Any) -> int | None:
    """Steps of the current epoch of a loader that knows them (a planned loader, also
    behind Lightning's wrapper ``LightningLoader``), else ``None``."""
    inner = getattr(loader, "loader", loader)
    if not hasattr(inner, "__len__"):
        return None
    try:
        return len(inner)
    except TypeError:  # a __len__ that is not available before the epoch is planned
        return None


def planned_total(total: int | float, loader: Any, cap: int | None) -> int | float:
    """Lightning's ``total`` of a bar when it is finite, else the steps ``loader`` plans
    (:func:`planned_steps`; at most ``cap``), else the infinite ``total``."""
    steps = None if math.isfinite(total) else planned_steps(loader)
    if steps is None:
        return total
    return steps if cap is None else min(steps, cap)


class ODBProgressBar(TQDMProgressBar):
    """Lightning's ``TQDMProgressBar`` with a step total for planned modes, an estimated
    one for ODB, and short metric names (tokens/s, samples/s, MFU where logged).

    Args:
        refresh_rate: Redraw every this many steps (1: every step).
        process_position: As in ``TQDMProgressBar``.
        leave: As in ``TQDMProgressBar``.
        train_samples: The run's training samples per epoch (the run context's, which the
            data module fills at setup); ``None``: ODB epochs get no estimated total.
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        leave: bool = False,
        train_samples: TrainSampleCount | None = None,
    ) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self.train_samples = train_samples
        self._epoch: int | None = None  # the epoch the bar was set up for
        self._epoch_samples = 0
        self._epoch_steps = 0
        self._estimated = False
        self._round: int | None = None  # the round of the last step
        self._restored: dict[str, Any] | None = None

    @override
    def init_train_tqdm(self) -> Tqdm:
        """Lightning's training bar, with the rate counted from the first step's end."""
        return SteadyRateTqdm(
            desc=self.train_description,
            position=(2 * self.process_position),
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    @property
    @override
    def total_train_batches(self) -> int | float:
        trainer = self.trainer
        limited = trainer.max_steps is not None and trainer.max_steps > 0
        cap = trainer.max_steps - trainer.global_step if limited else None
        return planned_total(super().total_train_batches, trainer.train_dataloader, cap)

    @property
    @override
    def total_val_batches_current_dataloader(self) -> int | float:
        loaders = self.trainer.val_dataloaders
        if isinstance(loaders, list | tuple):
            index = self._current_eval_dataloader_idx or 0
            loaders = loaders[index] if index < len(loaders) else None
        cap = self.trainer.num_sanity_val_steps if self.trainer.sanity_checking else None
        return planned_total(super().total_val_batches_current_dataloader, loaders, cap)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self._begin_epoch(trainer)

    def _begin_epoch(self, trainer: pl.Trainer) -> None:
        self._epoch = trainer.current_epoch
        self._epoch_samples = self._epoch_steps = 0
        self._round = None
        self._estimated = self.train_progress_bar.total is None

    def _resume_epoch(self, trainer: pl.Trainer, steps_done: int) -> None:
        """Set the bar up for an epoch resumed after ``steps_done`` steps (Lightning skips
        ``on_train_epoch_start`` then)."""
        bar = self.train_progress_bar
        bar.reset()
        bar.set_description(f"Epoch {trainer.current_epoch}")
        left = self.total_train_batches  # the resumed plan's steps (it is iterating now)
        bar.total = None if math.isinf(left) else steps_done + int(left)
        self._begin_epoch(trainer)
        saved, self._restored = self._restored, None
        if self._estimated and saved is not None and saved["epoch"] == trainer.current_epoch:
            # The resumed loader numbers its rounds afresh and its first one holds the
            # rest of the interrupted window: the next refinement is at that round's end.
            self._epoch_steps, self._epoch_samples = saved["steps"], saved["samples"]
            bar.total = saved["total"]

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._epoch != trainer.current_epoch:
            self._resume_epoch(trainer, steps_done=batch_idx)

    def _rank_share(self, trainer: pl.Trainer) -> float | None:
        """This rank's part of the epoch's training samples (``None`` when unknown)."""
        samples = self.train_samples.get() if self.train_samples is not None else None
        return samples / trainer.world_size if samples else None

    def _refine_estimate(self, trainer: pl.Trainer, n: int) -> None:
        """The total from the rounds ended so far (called before the step's counts are
        added, when the step opens a new round): set once the ended rounds hold
        :data:`ESTIMATE_AFTER_SHARE` of the rank's samples, and again only if the steps
        have reached it."""
        share = self._rank_share(trainer)
        bar = self.train_progress_bar
        if not (share and self._epoch_samples):
            return
        if bar.total is None and self._epoch_samples < ESTIMATE_AFTER_SHARE * share:
            return
        if bar.total is not None and n <= bar.total:
            return
        estimate = math.ceil(self._epoch_steps * share / self._epoch_samples)
        # n - 1 - epoch_steps: steps before what the bar counted (a resume without its counts)
        bar.total = max(n, n - 1 - self._epoch_steps + estimate)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        bar = self.train_progress_bar
        n = batch_idx + 1
        meta = getattr(batch, "meta", None)
        if self._estimated and meta is not None:
            if self._round is not None and meta.round_index != self._round:
                self._refine_estimate(trainer, n)
            self._round = meta.round_index
        self._epoch_steps += 1
        if meta is not None and not meta.is_idle:
            self._epoch_samples += meta.local_samples
        if bar.total is not None and n > bar.total:
            # A resumed plan that counted short; an estimate that did: once more, from
            # every step so far (the round under way included).
            share = self._rank_share(trainer) if self._estimated else None
            known = share and self._epoch_samples
            again = math.ceil(self._epoch_steps * share / self._epoch_samples) if known else 0
            bar.total = max(n, n - self._epoch_steps + again)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._epoch_steps == 1 and isinstance(bar, SteadyRateTqdm):
            bar.start_rate_clock(n)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        bar = self.train_progress_bar
        if self._estimated:
            bar.total = bar.n  # the epoch's real step count
            bar.refresh()
        super().on_train_epoch_end(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The online estimate's counts, so that a resumed epoch continues it."""
        bar = self._train_progress_bar
        total = None if bar is None or not self._estimated else bar.total
        return {
            "epoch": self._epoch,
            "steps": self._epoch_steps,
            "samples": self._epoch_samples,
            "total": total,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict)

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return {BAR_NAMES.get(name, name): value for name, value in metrics.items()}
