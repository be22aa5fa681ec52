"""Faults in a real 2-rank ``train.py`` run (``trainer=ddp_cpu``, ``debug=smoke``): an
exception in ``training_step`` on one rank, a rank killed, SIGTERM and Ctrl-C during an
epoch. Every process of the job (both ranks, their loader workers and collate processes)
is gone within 30 s of the fault, and the output says what happened on each rank.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from odb_lightning.testing.train_faults import EXIT_BOUND_S, TrainFaultResult, run_train_fault

PROCESSES = 6  # 2 ranks, each with 1 loader worker (debug=smoke) and 1 collate process
GLOO_PEER_GONE = "Connection closed by peer"  # the training group's all-reduce on rank 0


# Lightning's launcher polls rank 1 every 5 s and SIGKILLs rank 0 once rank 1 has failed:
# rank 0 exits with its own error (code 1) or, if that poll comes first, by that SIGKILL.
LAUNCHER_KILLED = -signal.SIGKILL


def _check_exit(result: TrainFaultResult) -> None:
    assert len(result.job_pids) == PROCESSES, result.output[-3000:]
    assert result.leftover_pids == [], result.output[-3000:]
    assert result.seconds_to_exit is not None
    assert result.seconds_to_exit < EXIT_BOUND_S


def _check_rank0_failed(result: TrainFaultResult, error: str) -> None:
    assert result.returncode in (1, LAUNCHER_KILLED), result.output[-3000:]
    if result.returncode == 1:
        assert error in result.output


def test_exception_in_training_step_on_one_rank_stops_every_rank(tmp_path: Path) -> None:
    result = run_train_fault(tmp_path, "raise", 1)
    _check_exit(result)
    # Rank 1 raised; rank 0 failed in the gradient all-reduce of the same step.
    assert "RuntimeError: injected failure in training_step 2 on rank 1" in result.output
    _check_rank0_failed(result, GLOO_PEER_GONE)


@pytest.mark.slow  # the loader-level matrix kills a rank in the default tier
def test_killed_rank_stops_the_job(tmp_path: Path) -> None:
    result = run_train_fault(tmp_path, "kill", 1)
    _check_exit(result)
    _check_rank0_failed(result, GLOO_PEER_GONE)


def test_sigterm_during_an_epoch_stops_every_rank(tmp_path: Path) -> None:
    result = run_train_fault(tmp_path, "sigterm", 0)
    _check_exit(result)
    # Lightning forwards SIGTERM to rank 1 and both ranks stop at the next step boundary;
    # train.py then exits as a terminated job (128 + SIGTERM), not as a finished one.
    assert "[rank: 0] Received SIGTERM: 15" in result.output
    assert "[rank: 1] Received SIGTERM: 15" in result.output
    assert "Traceback" not in result.output
    assert result.returncode == 128 + signal.SIGTERM
    assert not (result.probe_dir.parent / "run" / "summary.json").exists()  # not finished


@pytest.mark.slow  # the same Lightning teardown as SIGTERM, which runs in the default tier
def test_ctrl_c_during_an_epoch_stops_every_rank(tmp_path: Path) -> None:
    result = run_train_fault(tmp_path, "sigint", 0)  # SIGINT to the job's process group
    _check_exit(result)
    assert "Traceback" not in result.output
    # Lightning SIGKILLs rank 1 on a KeyboardInterrupt, then exits rank 0 with code 1.
    _check_rank0_failed(result, "Detected KeyboardInterrupt, attempting graceful shutdown")
