"""Stops on SIGTERM, SIGINT and SIGUSR1 without a collective in a signal handler.

Lightning 2.6's own SIGTERM handler broadcasts over the training group from inside the
handler; when the signal lands while the other ranks are in a collective of the step (a
backward's gradient all-reduce), the job deadlocks. Here a handler only records the
signal. At every step boundary (``on_train_batch_end``, which every rank reaches for
every micro-batch, IDLE ones included) the ranks agree on it with one one-element
all-reduce (the largest signal number wins: SIGTERM over SIGUSR1 over SIGINT), so all of
them stop after the same step: they save an exact-resume checkpoint
(``<checkpoint dir>/stop-epoch<E>-step<S>.ckpt``, with ``last.ckpt`` re-linked to it), end
the fit, and the application exits 143 (SIGTERM) or 130 (SIGINT), or requeues the job
under SLURM (SIGUSR1: ``scontrol requeue``) and exits 0.

A second SIGINT while a stop is pending interrupts at once (``KeyboardInterrupt``), as a
second Ctrl-C does anywhere.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from odb_lightning.lit.checkpointing import replace_link, stop_checkpoint_name

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}
"""Exit status by stop signal (the shell's convention); SIGUSR1 requeues and exits 0."""


class GracefulStop(Callback):
    """Records stop signals and stops every rank after the same step (module docstring).

    Attributes:
        stopped_by: The agreed signal once the fit stopped on it, else ``None``.
        checkpoint: The checkpoint saved at the stop.
    """

    def __init__(self) -> None:
        self._received: int = 0
        self._previous: dict[int, Any] = {}
        self.stopped_by: signal.Signals | None = None
        self.checkpoint: Path | None = None

    # -- signals -----------------------------------------------------------------------
    def _record(self, signum: int, _: FrameType | None) -> None:
        if signum == signal.SIGINT and self._received:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._received = max(self._received, signum)
        # Only a flag and a write: nothing here may block or talk to other ranks.
        os.write(2, f"received {signal.Signals(signum).name}: stopping after this step\n".encode())

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._record)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    # -- hooks -------------------------------------------------------------------------
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning has registered its own handlers (in fit, before the loops run):
        # these replace them for the whole fit.
        self._install()

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        agreed = self._agree(trainer, pl_module.device)
        if not agreed or trainer.should_stop:
            return
        self.stopped_by = signal.Signals(agreed)
        self.checkpoint = self._save(trainer)
        trainer.should_stop = True
        log.warning(
            "stopping on %s after optimizer step %d: checkpoint %s",
            self.stopped_by.name,
            trainer.global_step,
            self.checkpoint,
        )

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    # -- parts -------------------------------------------------------------------------
    def _agree(self, trainer: pl.Trainer, device: torch.device) -> int:
        """The largest signal any rank received (a collective every rank takes here)."""
        if trainer.world_size == 1:
            return self._received
        local = torch.tensor([self._received], dtype=torch.int64, device=device)
        return int(trainer.strategy.reduce(local, reduce_op="max").item())

    def _save(self, trainer: pl.Trainer) -> Path:
        """An exact-resume checkpoint of this step (a collective: every rank saves), with
        ``last.ckpt`` re-linked to it atomically."""
        directory = _checkpoint_dir(trainer)
        path = directory / stop_checkpoint_name(trainer.current_epoch, trainer.global_step)
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            replace_link(str(path), str(directory / "last.ckpt"))
        for callback in trainer.callbacks:
            if isinstance(callback, ModelCheckpoint):
                # This step is saved: the checkpoint callback's epoch-end save skips it, and
                # its end-of-fit save_last (which runs when it saved nothing itself) does
                # not overwrite the last.ckpt link with a copy.
                callback._last_global_step_saved = trainer.global_step
                callback._last_checkpoint_saved = str(path)
        trainer.strategy.barrier("odb-graceful-stop")
        return path


def _checkpoint_dir(trainer: pl.Trainer) -> Path:
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath)
    return Path(trainer.default_root_dir) / "checkpoints"


def requeue_slurm_job() -> int:
    """``scontrol requeue`` this SLURM job (array task aware); the command's exit status.

    Raises:
        RuntimeError: Not inside a SLURM job.
    """
    array_job, array_task = (
        os.environ.get("SLURM_ARRAY_JOB_ID"),
        os.environ.get("SLURM_ARRAY_TASK_ID"),
    )
    job = (
        f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    )
    if not job or not re.fullmatch(r"[0-9_]+", job):
        raise RuntimeError(
            f"SIGUSR1 asks for a SLURM requeue, but SLURM_JOB_ID is {job!r}: not a SLURM job"
        )
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        log.warning("requeued SLURM job %s", job)
    else:
        log.error("scontrol requeue %s failed (%d): %s", job, done.returncode, done.stderr.strip())
    return done.returncode
