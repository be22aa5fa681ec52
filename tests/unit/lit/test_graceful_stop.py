"""The stop protocol's pieces: handlers that only record, the strongest signal, the SLURM
requeue command and the wait for the job's processes at the end (the atomic ``last.ckpt``
link: test_checkpoints.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import psutil
import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import hand_over, make_sample, pad, tiny_module
from odb_lightning.lit.callbacks.checkpointing import (
    AtomicLinkModelCheckpoint,
    linked_checkpoint,
    replace_link,
)
from odb_lightning.lit.callbacks.graceful_stop import (
    GracefulStop,
    launched_child,
)
from odb_lightning.lit.callbacks.job_processes import reap_children
from odb_lightning.lit.callbacks.slurm_requeue import requeue_slurm_job, slurm_job_to_requeue


def test_a_handler_only_records_and_the_strongest_signal_wins() -> None:
    stop = GracefulStop()
    stop._keep_before_fit()
    stop._install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)  # submitit's time-limit signal
        assert stop._received == signal.SIGUSR2
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop._received == signal.SIGTERM  # SIGTERM over SIGUSR2, SIGUSR1, SIGINT
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C interrupts at once
            os.kill(os.getpid(), signal.SIGINT)
        # A stop is under way: the end of the fit keeps the recording handlers (the
        # SIGTERM SLURM sends after a requeue meets them, not Lightning's) and the deadline,
        # though Lightning's teardown, before this one, put back the handlers of before.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop._restore()
        assert signal.getsignal(signal.SIGTERM) == stop._record
        assert stop._deadline is not None and not stop._deadline.finished.is_set()
    finally:
        stop.finish()
    assert signal.getsignal(signal.SIGTERM) is not stop._record
    # finish() ends the deadline: it would otherwise exit this process later.
    assert stop._deadline is not None and stop._deadline.finished.is_set()
    stop._deadline.join(timeout=5)
    assert not stop._deadline.is_alive()


def test_without_a_signal_the_handlers_of_before_the_fit_come_back() -> None:
    def before(signum: int, _: object) -> None:
        raise AssertionError("not called")

    previous = signal.signal(signal.SIGTERM, before)
    try:
        stop = GracefulStop()
        stop._keep_before_fit()
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # Lightning's, in the fit
        stop._install()
        stop._restore()  # after Lightning's own teardown
        assert signal.getsignal(signal.SIGTERM) is before
        assert stop._deadline is None
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_during_the_setup_is_recorded_for_the_fit() -> None:
    """From ``record_from_now`` (the start of a run) a stop signal is recorded, not the end
    of the process; the fit's own handlers are replaced again at its start, and the
    handlers of before the run come back without a stop."""

    def before(signum: int, _: object) -> None:
        raise AssertionError("not called")

    previous = signal.signal(signal.SIGUSR1, before)
    stop = GracefulStop()
    try:
        stop.record_from_now()
        os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's signal while the records convert
        assert stop._received == signal.SIGUSR1 and stop._deadline is not None
        stop._keep_before_fit()  # the setup hook keeps what was there before the run
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # a handler the fit registers
        stop._take_over()
        assert signal.getsignal(signal.SIGUSR1) == stop._record
        stop.finish()  # the process goes on (a test): the handler of before the run
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        stop.finish()
        signal.signal(signal.SIGUSR1, previous)


def test_requeue_names_the_slurm_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert slurm_job_to_requeue({}) is None  # not a SLURM job: nothing to requeue
    assert slurm_job_to_requeue({"SLURM_JOB_ID": "12"}) == "12"
    assert slurm_job_to_requeue({"SLURM_JOB_ID": "12; rm -rf"}) is None
    array = {"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    assert slurm_job_to_requeue(array) == "77_3"  # a submitit sweep's point
    calls = tmp_path / "calls"
    stub = tmp_path / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" > {calls}\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert requeue_slurm_job("77_3") == 0
    assert calls.read_text().strip() == "requeue 77_3"


def test_reaping_waits_for_the_ranks_and_their_descendants_not_for_a_service() -> None:
    """Rank 0's end (``reap_job``): a rank and its child that run until their stdin closes
    are named while they run; once it closes, the wait returns with both gone and the rank
    reaped (no zombie left behind). A helper process that lives as long as rank 0 (W&B's
    service) is not waited for: it would hold every run's end for the whole timeout."""
    grandchild_code = "import sys; sys.stdin.read()"
    child_code = (
        "import subprocess, sys\n"
        f"grandchild = subprocess.Popen([sys.executable, '-c', {grandchild_code!r}])\n"
        "print(grandchild.pid, flush=True)\n"
        "sys.stdin.read()\n"
        "grandchild.wait()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    service = subprocess.Popen([sys.executable, "-c", grandchild_code], stdin=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdin is not None
        grandchild = int(child.stdout.readline())  # the event: both processes exist
        running = reap_children(0.2, [child.pid])
        assert {child.pid, grandchild} <= set(running)
        assert service.pid not in running
        child.stdin.close()  # both read the same pipe: both exit
        left = reap_children(30.0, [child.pid])
        assert child.pid not in left and grandchild not in left
        with pytest.raises(psutil.NoSuchProcess):  # reaped, not a zombie
            psutil.Process(child.pid).status()
        assert not psutil.pid_exists(grandchild) or (
            psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        )
        assert service.poll() is None  # still running, and not waited for
    finally:
        child.kill()
        service.kill()
        service.wait()


@pytest.mark.parametrize(
    ("environment", "local_rank", "code"),
    [
        (LightningEnvironment, 0, 143),  # the node's first process: the job's status
        (LightningEnvironment, 1, 0),  # a child of Lightning's launcher, which watches it
        (TorchElasticEnvironment, 1, 143),  # torchrun's agent reads every rank's status
    ],
)
def test_a_stopped_rank_of_lightnings_launcher_exits_0(
    environment: type, local_rank: int, code: int
) -> None:
    """Lightning's observer SIGKILLs the node's first process once a child it started has
    exited with a status other than 0: such a child leaves a stop with 0, so the job's own
    status stays 143."""
    trainer = SimpleNamespace(
        strategy=DDPStrategy(cluster_environment=environment()), local_rank=local_rank
    )
    stop = GracefulStop()
    stop._launched_child = launched_child(trainer)  # what on_train_start records
    assert stop.exit_code(signal.SIGTERM) == code
    assert stop.exit_code(signal.SIGINT) == (0 if code == 0 else 130)
    assert stop.exit_code(signal.SIGUSR1) == (0 if code == 0 else 138)  # not requeued


class SignalAtStep(pl.Callback):
    """Sends this process SIGTERM once optimizer step ``step`` has run (listed before the
    stop callback, whose hook then sees it at the same boundary)."""

    def __init__(self, step: int) -> None:
        self.step = step

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("every_n_train_steps", [2, None])
def test_the_stop_checkpoint_is_the_last_one_the_fit_writes(
    tmp_path: Path, every_n_train_steps: int | None
) -> None:
    """Stopped after step 2, which the checkpoint callback would also save (every 2 steps,
    or at the end of the epoch the stop cuts short): only the stop's checkpoint is written
    and last.ckpt names it."""
    stop = GracefulStop()
    checkpoint = AtomicLinkModelCheckpoint(
        dirpath=tmp_path, every_n_train_steps=every_n_train_steps, save_last="link"
    )
    batches = [pad([make_sample(7, 2, seed)]) for seed in range(6)]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[SignalAtStep(2), stop, checkpoint],
    )
    loader = DataLoader(batches, batch_size=None, collate_fn=hand_over)
    try:
        trainer.fit(tiny_module(loss_chunk_tokens=4), train_dataloaders=loader)
    finally:
        stop.finish()  # this process goes on: no deadline may end it
    assert (trainer.global_step, stop.stopped_by) == (2, signal.SIGTERM)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "stop-epoch0-step2.ckpt"]
    assert (tmp_path / "last.ckpt").resolve() == stop.checkpoint


def test_the_linked_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    """What a deadline exit names: ``last.ckpt``'s target when complete, never a save that
    a kill cut short (Lightning writes the file in place, then the link moves)."""
    assert linked_checkpoint(tmp_path) is None  # nothing saved yet
    torch.save({"global_step": 1}, tmp_path / "epoch0-step1.ckpt")
    replace_link(str(tmp_path / "epoch0-step1.ckpt"), str(tmp_path / "last.ckpt"))
    (tmp_path / "epoch0-step2.ckpt").write_bytes(b"PK\x03\x04 cut short")  # being written
    assert linked_checkpoint(tmp_path) == (tmp_path / "epoch0-step1.ckpt", 1)
    (tmp_path / "epoch0-step1.ckpt").write_bytes(b"PK\x03\x04")  # truncated under the link
    assert linked_checkpoint(tmp_path) is None


DEADLINE_IN_A_SAVE = """
import os, signal, sys, threading
import lightning.pytorch as pl
from torch.utils.data import DataLoader
from helpers.tiny_lm import hand_over, make_sample, pad, tiny_module
from odb_lightning.lit.callbacks.checkpointing import (
    AtomicLinkModelCheckpoint,
    linked_checkpoint,
    replace_link,
)
from odb_lightning.lit.callbacks.graceful_stop import GracefulStop, StopSettings

class SlowSave(AtomicLinkModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath):
        if trainer.global_step == 2:  # the signal comes while step 2 is being saved
            with open(filepath, "wb") as partial:
                partial.write(b"PK\\x03\\x04")
            os.kill(os.getpid(), signal.SIG)
            threading.Event().wait()  # a save slower than the deadline
        super()._save_checkpoint(trainer, filepath)

directory = sys.argv[1]
checkpoint = SlowSave(dirpath=directory, every_n_train_steps=1, save_top_k=-1, save_last="link")
stop = GracefulStop(StopSettings(deadline_s=1.0))
trainer = pl.Trainer(
    accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
    enable_model_summary=False, limit_val_batches=0, callbacks=[stop, checkpoint],
)
batches = [pad([make_sample(7, 2, seed)]) for seed in range(6)]
loader = DataLoader(batches, batch_size=None, collate_fn=hand_over)
trainer.fit(tiny_module(loss_chunk_tokens=4), train_dataloaders=loader)
"""


@pytest.mark.parametrize(
    "signum", [signal.SIGUSR1, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)]
)
def test_a_deadline_exit_names_the_checkpoint_on_disk(tmp_path: Path, signum: int) -> None:
    """A stop signal during step 2's checkpoint save, with a deadline shorter than the save:
    the process exits at the deadline naming step 1's checkpoint (on disk, complete) and one
    step to replay; outside SLURM a requeue signal says nothing requeues it."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": f"{root / 'tests'}:{root}"}
    env.pop("SLURM_JOB_ID", None)
    script = DEADLINE_IN_A_SAVE.replace("signal.SIG)", f"signal.{signal.Signals(signum).name})")
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    name = signal.Signals(signum).name
    assert done.returncode == 128 + signum, output[-3000:]
    saved = tmp_path / "epoch0-step1.ckpt"
    assert (
        f"the stop on {name} did not end within stop.deadline_s=1s (waiting for a step "
        f"boundary; optimizer step 2 done): exiting now; the newest checkpoint on disk is "
        f"{saved} (optimizer step 1); a resume will replay 1 optimizer step(s)"
    ) in output, output[-3000:]
    assert torch.load(saved, weights_only=False)["global_step"] == 1
    if signum == signal.SIGUSR1:
        assert "SIGUSR1 asks for a SLURM requeue, but this process is not in a SLURM job" in output
