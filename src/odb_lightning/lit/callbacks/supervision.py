"""Refuse to go on after a whole epoch without a supervised token on any rank."""

from __future__ import annotations

import lightning.pytorch as pl
from typing_extensions import override

from odb_lightning.lit.callbacks.counters import StepCounters
from odb_lightning.lit.callbacks.rank_gather import gather_rows
from odb_lightning.lit.callbacks.run_report import NoSupervisedTokensError


class SupervisionCheck(pl.Callback):
    """After the first training epoch, raise :class:`NoSupervisedTokensError` if the
    epoch emitted samples but no rank saw a supervised token.

    An epoch cut short (a stop was requested, or ``max_steps`` reached, on any rank) is no
    evidence: its few steps may all hold unsupervised samples of a set that has others.
    Every rank gathers its row all the same, so the collective is reached alike.

    The data module refuses such data at startup where it can tell (length-pass modes;
    records without an assistant turn). Online modes tokenize in the loader workers, so a
    set whose assistant turns are all cut off by ``max_seq_len`` is only known here, after
    the first epoch (one all-gather, once per run).

    Args:
        counters: This rank's step counters (the callback that counts them).
        max_seq_len: The run's ``data.sizes.max_seq_len``, named in the error.
    """

    def __init__(self, counters: StepCounters, max_seq_len: int | None) -> None:
        self.counters = counters
        self.max_seq_len = max_seq_len
        self._checked = False

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._checked:
            return
        self._checked = True
        totals = self.counters.totals
        row = [float(totals.loss_tokens), float(totals.samples), float(_cut_short(trainer))]
        rows = gather_rows(trainer, pl_module, row)
        if sum(r[0] for r in rows) > 0 or not any(r[1] for r in rows) or any(r[2] for r in rows):
            return
        emitted = int(sum(r[1] for r in rows))
        raise NoSupervisedTokensError(
            f"no supervised tokens in the first training epoch: {emitted} samples emitted "
            f"over {trainer.world_size} rank(s), every label -100 after the template and "
            f"max_seq_len={self.max_seq_len}; training changes nothing. SFT trains on "
            "assistant turns: check that the data has them within data.sizes.max_seq_len tokens"
        )


def _cut_short(trainer: pl.Trainer) -> bool:
    """Whether this rank's epoch ended before its data did: a stop request (a signal, a
    stop callback) or the ``max_steps`` limit."""
    max_steps = trainer.max_steps
    return bool(trainer.should_stop) or (
        max_steps is not None and 0 <= max_steps <= trainer.global_step
    )
