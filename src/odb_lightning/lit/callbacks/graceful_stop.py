"""Stops on SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 without a collective in a signal handler.

Lightning 2.6's own SIGTERM handler broadcasts over the training group from inside the
handler; when the signal lands while the other ranks are in a collective of the step (a
backward's gradient all-reduce), the job deadlocks. Here a handler only records the
signal. At every step boundary (``on_train_batch_end``, which every rank reaches for
every micro-batch, IDLE ones included) the ranks agree on it with one one-element
all-reduce (the largest signal number wins: SIGTERM over SIGUSR2 over SIGUSR1 over
SIGINT), so all of them stop after the same step: they save an exact-resume checkpoint
(``<checkpoint dir>/stop-epoch<E>-step<S>.ckpt``, with ``last.ckpt`` re-linked to it), end
the fit, and the application exits 143 (SIGTERM) or 130 (SIGINT). SIGUSR1 (SLURM's
``--signal=USR1@<s>``) and SIGUSR2 (the time-limit signal of submitit, which Hydra's
submitit launcher runs) ask for a requeue (:data:`REQUEUE_SIGNALS`): inside a SLURM job
rank 0 runs ``scontrol requeue`` and the job exits 0; outside one nothing can requeue it,
and the application says so and exits 138 (SIGUSR1) or 140 (SIGUSR2).

A second SIGINT while a stop is pending interrupts at once (``KeyboardInterrupt``), as a
second Ctrl-C does anywhere.

The whole stop is bounded: from the first signal, ``stop.deadline_s`` covers the wait for
the step boundary, the save and the teardown (SLURM: 30 s from SIGTERM to SIGKILL by
default; a ``--signal=USR1@<s>`` lead time allows more). A rank still running at the
deadline (a slow step, a rank stuck in a collective, a save too slow for the deadline)
logs the newest complete checkpoint on disk (what ``last.ckpt`` names, checked) and how
many optimizer steps a resume will replay, requeues the job on a requeue signal (rank 0,
inside SLURM), kills the job's processes it started (the other ranks under Lightning's
launcher, its loader processes), reaps them and exits with the stop's status. The
deadline runs in a timer thread the first signal starts; it talks to no rank.

The recording handlers are in place from the start of a run (:meth:`GracefulStop.record_from_now`,
which the app calls before it builds the parts), so a signal during the setup stops the
run at its first step boundary (or at the deadline) as one during the fit does.

Once a stop signal came, this process keeps its recording handlers until it exits: the
SIGTERM SLURM sends every process of a job that rank 0 requeued, or of a job ending, meets
them (the handlers Lightning had before the fit would end a clean stop as a failure).
Without a stop signal, the handlers in place before the fit come back at its end.

The job's status is its first process's. The other ranks that Lightning's launcher started
on a node exit 0 on a stop: the launcher's observer in the node's first process SIGKILLs it
as soon as one of them has exited with another status, so their 143 would turn the job's
143 into a kill (-9) while it reaps them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ParallelStrategy
from typing_extensions import override

from odb_lightning.lit.callbacks.checkpointing import (
    linked_checkpoint,
    replace_link,
    stop_checkpoint_name,
)
from odb_lightning.lit.callbacks.job_processes import kill_descendants
from odb_lightning.lit.callbacks.slurm_requeue import (
    not_requeued_message,
    requeue_slurm_job,
    slurm_job_to_requeue,
)
from odb_lightning.lit.callbacks.step_end import StepEndCallback
from odb_lightning.lit.callbacks.stop_settings import StopSettings

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""Stop signals that ask for a SLURM requeue (SLURM's ``--signal=USR1``, submitit's USR2)."""
EXIT_CODES = {signum: 128 + signum for signum in STOP_SIGNALS}
"""Exit status by stop signal (the shell's convention); a requeued job exits 0."""


REAP_TIMEOUT_S = 5.0
"""How long a rank that exits at the deadline waits for the processes it killed."""


class GracefulStop(StepEndCallback):
    """Records stop signals and stops every rank after the same step (module docstring).

    Args:
        settings: The stop's deadline.

    Attributes:
        stopped_by: The agreed signal once the fit stopped on it, else ``None``.
        checkpoint: The checkpoint saved at the stop.
        stopped_at_step: The optimizer step after which the fit stopped.
    """

    def __init__(self, settings: StopSettings | None = None) -> None:
        self.settings = settings or StopSettings()
        self._received: int = 0
        self._previous: dict[int, Any] = {}
        self._installed = False
        self._deadline: threading.Timer | None = None
        self._step = 0
        self._phase = "waiting for a step boundary"
        self._checkpoint_dir: Path | None = None
        self.stopped_by: signal.Signals | None = None
        self.checkpoint: Path | None = None
        self.stopped_at_step: int | None = None
        self._launched_child = False
        self._global_zero = True

    # -- signals -----------------------------------------------------------------------
    def _record(self, signum: int, _: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopped_by is not None:  # the job's end, e.g. SLURM's SIGTERM after a requeue
            os.write(2, f"received {name} after the stop: ending as the stop decided\n".encode())
            return
        if signum == signal.SIGINT and self._received:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._received = max(self._received, signum)
        self._start_deadline()
        # Only a flag, a timer and a write: nothing here may block or talk to other ranks.
        os.write(2, f"received {name}: stopping after this step\n".encode())

    def _start_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = threading.Timer(self.settings.deadline_s, self._exit_at_deadline)
            self._deadline.daemon = True
            self._deadline.start()

    def _exit_at_deadline(self) -> None:
        """The stop did not end within the deadline: leave now, every process of this
        rank's tree with it (see the module docstring). Runs in the timer thread."""
        signum = signal.Signals(self._received)
        step = self._step
        newest = linked_checkpoint(self._checkpoint_dir) if self._checkpoint_dir else None
        if newest is None:
            kept, replay = "no checkpoint of this run is on disk: a resume starts over", step
        else:
            kept = f"the newest checkpoint on disk is {newest.path} (optimizer step {newest.step})"
            replay = step - newest.step
        log.error(
            "the stop on %s did not end within stop.deadline_s=%gs (%s; optimizer step %d "
            "done): exiting now; %s; a resume will replay %d optimizer step(s)",
            signum.name, self.settings.deadline_s, self._phase, step, kept, replay,
        )  # fmt: skip
        code = self.exit_code(signum)
        if signum in REQUEUE_SIGNALS:
            job = slurm_job_to_requeue()
            if job is None:
                log.warning(not_requeued_message(signum, code))
            elif self._global_zero:
                code = 0 if requeue_slurm_job(job) == 0 else 1
            else:
                code = 0
        for handler in logging.getLogger().handlers:
            handler.flush()
        kill_descendants(REAP_TIMEOUT_S)
        os._exit(code)

    def exit_code(self, signum: signal.Signals) -> int:
        """This process's status for a stop on ``signum`` that was not requeued:
        :data:`EXIT_CODES`, or 0 in a rank that Lightning's launcher started (see the module
        docstring)."""
        return 0 if self._launched_child else EXIT_CODES[signum]

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self._installed:
            return
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._record)
        self._installed = True

    def record_from_now(self) -> None:
        """Record stop signals from now on, before the fit: a job's setup (a record
        table's conversion, the model's build) can take minutes, and a signal then stops
        the run at its first step boundary, bounded by the deadline, as one during the fit
        does (SLURM's requeue signal requeues it) instead of ending the process at once.
        The handlers in place now come back after a fit without a stop."""
        self._keep_before_fit()
        self._install()

    def _take_over(self) -> None:
        """Install the recording handlers again over whatever the fit registered (Lightning
        composes its own with the ones it finds)."""
        self._installed = False
        self._install()

    def _keep_before_fit(self) -> None:
        """Note the handlers in place before the fit (before Lightning registers its own)."""
        if threading.current_thread() is threading.main_thread() and not self._installed:
            self._previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def _restore(self) -> None:
        """The handlers of before the fit back, unless a stop signal came: then this
        process records until it exits (Lightning's teardown, before this one, put its
        handlers of before the fit back: ours replace them again), and the deadline keeps
        running."""
        if self._received:
            self._installed = False
            self._install()
            return
        if self._deadline is not None:
            self._deadline.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous, self._installed = {}, False

    def finish(self) -> None:
        """End the deadline and restore the handlers of before the fit: the process goes on
        after a stop (a test, a notebook). The application exits instead."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._received = 0
        self._restore()

    # -- hooks -------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._keep_before_fit()  # Lightning registers its handlers after the setup hooks

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning has registered its own handlers (in fit, before the loops run):
        # these replace them for the whole fit.
        self._take_over()
        self._launched_child = launched_child(trainer)
        self._global_zero = trainer.is_global_zero
        self._checkpoint_dir = _checkpoint_dir(trainer)

    @override
    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        self._step = trainer.global_step
        agreed = self._agree(trainer, pl_module.device)
        if not agreed or trainer.should_stop:
            return
        # A boundary is reached; the deadline goes on bounding the save and the teardown.
        self._received = max(self._received, agreed)  # a rank that got no signal itself
        self._start_deadline()  # here from the agreement on
        self._phase = "saving the stop checkpoint"
        self.stopped_at_step = trainer.global_step
        self.checkpoint = self._save(trainer)
        self.stopped_by = signal.Signals(agreed)
        self._phase = "ending the job after the stop checkpoint"
        trainer.should_stop = True
        # Lightning validates when should_stop is set mid-epoch: a stop skips it.
        trainer.limit_val_batches = 0
        log.warning(
            "stopping on %s after optimizer step %d: checkpoint %s",
            self.stopped_by.name,
            trainer.global_step,
            self.checkpoint,
        )

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # After Lightning's own teardown restored its handlers of before the fit.
        self._restore()

    def stop_entries(self) -> dict[str, Any]:
        """What the run summary says about a stop (empty when the run was not stopped)."""
        if self.stopped_by is None:
            return {}
        return {
            "stopped_by": self.stopped_by.name,
            "stopped_after_step": self.stopped_at_step,
            "stop_checkpoint": str(self.checkpoint) if self.checkpoint else None,
        }

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
                # This step is saved and the fit ends after it: the checkpoint callback
                # saves nothing more (its save of this step, or at the end of the epoch the
                # stop cuts short, would re-link last.ckpt away from the stop checkpoint).
                callback.save_top_k = 0
                callback.save_last = callback.save_on_exception = False
        trainer.strategy.barrier("odb-graceful-stop")
        return path


def _checkpoint_dir(trainer: pl.Trainer) -> Path:
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath)
    return Path(trainer.default_root_dir) / "checkpoints"


def launched_child(trainer: pl.Trainer) -> bool:
    """This rank is one that Lightning's launcher started beside the node's first process
    (``LOCAL_RANK`` set, not by torchrun or SLURM)."""
    strategy = trainer.strategy
    environment = strategy.cluster_environment if isinstance(strategy, ParallelStrategy) else None
    return isinstance(environment, LightningEnvironment) and trainer.local_rank > 0
