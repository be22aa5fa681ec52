"""The stop protocol's pieces: handlers that only record, the strongest signal, and the
SLURM requeue command (the atomic ``last.ckpt`` link: test_checkpoints.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from odb_lightning.lit.graceful_stop import GracefulStop, requeue_slurm_job


def test_a_handler_only_records_and_the_strongest_signal_wins() -> None:
    stop = GracefulStop()
    stop._install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop._received == signal.SIGTERM  # SIGTERM over SIGUSR1 over SIGINT
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C interrupts at once
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop._restore()
    assert signal.getsignal(signal.SIGTERM) is not stop._record
    # The deadline the signals started ends with the handlers: it would otherwise exit this
    # process stop.deadline_s later.
    assert stop._deadline is not None and stop._deadline.finished.is_set()
    stop._deadline.join(timeout=5)
    assert not stop._deadline.is_alive()


def test_requeue_needs_a_slurm_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    with pytest.raises(RuntimeError, match="SIGUSR1 asks for a SLURM requeue"):
        requeue_slurm_job()
    calls = tmp_path / "calls"
    stub = tmp_path / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" > {calls}\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert requeue_slurm_job() == 0
    assert calls.read_text().strip() == "requeue 77_3"
