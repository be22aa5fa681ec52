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

A stop must fit the scheduler's grace (SLURM: 30 s from SIGTERM to SIGKILL). After the
step boundary the fit skips validation and ends at once. A step that does not reach its
boundary within ``stop.deadline_s`` of the signal (a slow step, a rank stuck in a
collective) is not waited for: the rank that received the signal logs the newest
checkpoint and how many optimizer steps a resume will replay, kills the job's processes
it started (the other ranks under Lightning's launcher, its loader processes), reaps them
and exits with the stop's status. Nothing is saved then: the newest checkpoint stays the
valid one. The deadline runs in a timer thread the handler starts; it talks to no rank.

The job's status is its first process's. The other ranks that Lightning's launcher
started on a node exit 0 on a stop: the launcher's observer in the node's first process
SIGKILLs it as soon as one of them has exited with another status, so their 143 would
turn the job's 143 into a kill (-9) while it reaps them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import psutil
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ParallelStrategy
from typing_extensions import override

from odb_lightning.core.checks import check_positive
from odb_lightning.lit.callbacks.checkpointing import replace_link, stop_checkpoint_name
from odb_lightning.lit.callbacks.step_end import StepEndCallback

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}
"""Exit status by stop signal (the shell's convention); SIGUSR1 requeues and exits 0."""


REAP_TIMEOUT_S = 5.0
"""How long a rank that exits at the deadline waits for the processes it killed."""


@dataclass(frozen=True)
class StopSettings:
    """How a stop signal ends the run (Hydra group ``stop``)."""

    deadline_s: float = 25.0
    """Seconds from the signal within which the ranks must reach a step boundary; past
    it, the job exits without a stop checkpoint (the newest checkpoint stays valid). Below
    the scheduler's grace: SLURM's default is 30 s from SIGTERM to SIGKILL."""

    def __post_init__(self) -> None:
        check_positive("stop.deadline_s", self.deadline_s, "seconds")


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
        self._deadline: threading.Timer | None = None
        self._step, self._saved_step, self._saved_dir = 0, None, None
        self.stopped_by: signal.Signals | None = None
        self.checkpoint: Path | None = None
        self.stopped_at_step: int | None = None
        self._launched_child = False

    # -- signals -----------------------------------------------------------------------
    def _record(self, signum: int, _: FrameType | None) -> None:
        if signum == signal.SIGINT and self._received:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._received = max(self._received, signum)
        if self._deadline is None:
            self._deadline = threading.Timer(self.settings.deadline_s, self._exit_at_deadline)
            self._deadline.daemon = True
            self._deadline.start()
        # Only a flag, a timer and a write: nothing here may block or talk to other ranks.
        os.write(2, f"received {signal.Signals(signum).name}: stopping after this step\n".encode())

    def _exit_at_deadline(self) -> None:
        """No step boundary within the deadline: leave now, every process of this rank's
        tree with it (see the module docstring). Runs in the timer thread."""
        name = signal.Signals(self._received).name
        if self._saved_step is None:
            kept = "no checkpoint was written in this run yet: a resume starts over"
            replay = self._step
        else:
            kept = (
                f"the newest checkpoint (in {self._saved_dir}, last.ckpt) was saved at "
                f"optimizer step {self._saved_step} and stays valid"
            )
            replay = self._step - self._saved_step
        log.error(
            "no step boundary within stop.deadline_s=%gs of %s (the step after optimizer step "
            "%d did not finish): exiting without a stop checkpoint; %s; a resume will replay "
            "%d optimizer step(s)",
            self.settings.deadline_s, name, self._step, kept, replay,
        )  # fmt: skip
        for handler in logging.getLogger().handlers:
            handler.flush()
        kill_descendants(REAP_TIMEOUT_S)
        os._exit(self.exit_code(signal.Signals(self._received)))

    def exit_code(self, signum: signal.Signals) -> int:
        """This process's status for a stop on ``signum``: :data:`EXIT_CODES`, or 0 in a
        rank that Lightning's launcher started (see the module docstring)."""
        return 0 if self._launched_child else EXIT_CODES.get(signum, 0)

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._record)

    def _restore(self) -> None:
        # The fit is over (or these handlers never ran one): no deadline may outlive it, or
        # its timer would end whatever the process does next.
        if self._deadline is not None:
            self._deadline.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    # -- hooks -------------------------------------------------------------------------
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning has registered its own handlers (in fit, before the loops run):
        # these replace them for the whole fit.
        self._install()
        self._launched_child = launched_child(trainer)

    @override
    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        self._step = trainer.global_step
        agreed = self._agree(trainer, pl_module.device)
        if not agreed or trainer.should_stop:
            return
        # A boundary is reached: from here the stop is bounded by the save and the teardown.
        if self._deadline is not None:
            self._deadline.cancel()
        self.stopped_by = signal.Signals(agreed)
        self.stopped_at_step = trainer.global_step
        self.checkpoint = self._save(trainer)
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
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Called before the file is written; the resume's newest-valid rule covers a save
        # cut off by the deadline's kill.
        self._saved_step, self._saved_dir = trainer.global_step, _checkpoint_dir(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()  # cancels the deadline: the fit ended before a boundary, or at one

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


def kill_descendants(timeout_s: float) -> list[int]:
    """SIGKILL every descendant of this process and wait (within ``timeout_s``) until each
    has exited; the PIDs still running afterwards."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue
    return _wait_exited(children, timeout_s)


def reap_children(timeout_s: float, ranks: Sequence[int] = ()) -> list[int]:
    """Wait up to ``timeout_s`` for the job's processes that this process started to exit:
    the ``ranks`` (PIDs of the other ranks Lightning's launcher started, already ending)
    and this process's ``multiprocessing`` children (loader workers, collate processes),
    each with its descendants, reaping this process's own; the PIDs still running
    afterwards. A helper that lives as long as the process (W&B's service) is not one of
    them: waiting for it would take the whole timeout."""
    roots = []
    for pid in [*ranks, *(child.pid for child in multiprocessing.active_children())]:
        try:
            root = psutil.Process(pid)
            roots += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return _wait_exited(roots, timeout_s)


def _wait_exited(processes: list[psutil.Process], timeout_s: float) -> list[int]:
    """Wait until each of ``processes`` has exited: this process's children are reaped;
    a grandchild counts once it is a zombie (its reaper is init, not this process)."""
    deadline = time.monotonic() + timeout_s
    running = processes
    while running and time.monotonic() < deadline:
        _, running = psutil.wait_procs(running, timeout=0.05)
        running = [p for p in running if _still_running(p)]
    return [p.pid for p in running]


def _still_running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
