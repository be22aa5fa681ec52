"""Faults in a real 2-rank ``train.py`` run (``trainer=ddp_cpu``, ``debug=smoke``): an
exception in ``training_step`` on one rank, a rank killed, SIGTERM and Ctrl-C during an
epoch. Every process of the job (both ranks, their loader workers and collate processes)
is gone within 30 s of the fault, and the output says what happened on each rank.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.train_run import read_audit, train
from testing.harness.train_faults import EXIT_BOUND_S, TrainFaultResult, run_train_fault

PROCESSES = 6  # 2 ranks, each with 1 loader worker (debug=smoke) and 1 collate process
# Rank 0's own error in the training group's collective once its peer is gone: Gloo
# reports either, depending on where rank 0's read meets the dead socket (both seen).
GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


# Lightning's launcher polls rank 1 every 5 s and SIGKILLs rank 0 once rank 1 has failed:
# rank 0 exits with its own error (code 1) or, if that poll comes first, by that SIGKILL.
LAUNCHER_KILLED = -signal.SIGKILL


def _check_exit(result: TrainFaultResult) -> None:
    assert len(result.job_pids) == PROCESSES, result.output[-3000:]
    assert result.leftover_pids == [], result.output[-3000:]
    assert result.seconds_to_exit is not None
    assert result.seconds_to_exit < EXIT_BOUND_S


def _check_rank0_failed(result: TrainFaultResult, errors: tuple[str, ...]) -> None:
    assert result.returncode in (1, LAUNCHER_KILLED), result.output[-3000:]
    if result.returncode == 1:
        assert any(error in result.output for error in errors), result.output[-3000:]


@pytest.mark.slow  # one rank's failure failing every rank: test_runtime_faults' matrix
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


STOP_LINE = "received SIGTERM: stopping after this step"
EPOCH = list(range(80))  # debug=smoke with data.sizes.val_samples=0: all 80 records train


def _stopped_and_resumed(tmp_path: Path, result: TrainFaultResult) -> tuple[Counter, Counter]:
    """The samples the stopped run trained and those its resume trains."""
    first = tmp_path / "run"
    checkpoint = (first / "checkpoints" / "last.ckpt").resolve()
    assert checkpoint.name.startswith("stop-"), sorted(p.name for p in checkpoint.parent.iterdir())
    second = tmp_path / "resumed"
    train(second, *RESUME, "audit_ids=true", f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}")
    before = Counter(i for rank in read_audit(first, 2) for step in rank for i in step)
    after = Counter(i for rank in read_audit(second, 2) for step in rank for i in step)
    return before, after


# A resume runs with the config saved in its checkpoint, the stopped run's fault included:
# the resume turns it off (the injecting module without a fault trains as the plain one).
RESUME = ("trainer=ddp_cpu", "data.sizes.val_samples=0", "+model.fault=none")


def test_sigterm_during_an_epoch_stops_every_rank(tmp_path: Path) -> None:
    result = run_train_fault(tmp_path, "sigterm", 0, "audit_ids=true")
    _check_exit(result)
    # Only rank 0 got the signal; both ranks stop after the same step, save, and train.py
    # exits as a terminated job (128 + SIGTERM), not as a finished one.
    assert STOP_LINE in result.output
    assert "Traceback" not in result.output
    assert result.returncode == 128 + signal.SIGTERM
    # Rank 1 exits 0: a 143 of Lightning's child makes its launcher SIGKILL rank 0 (-9).
    log = (tmp_path / "run" / "train.log").read_text()
    assert "Forcefully terminating" not in result.output + log
    audit = read_audit(tmp_path / "run", 2)
    assert len(audit[0]) == len(audit[1]) == 3  # fault at step 2: agreed at its end
    before, after = _stopped_and_resumed(tmp_path, result)
    assert before + after == Counter(EPOCH), "every sample once over the stop and the resume"


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["step", "backward", "batch_end"])
@pytest.mark.parametrize("target", [0, 1, -1], ids=["rank0", "rank1", "both"])
def test_stop_matrix_under_load(target: int, moment: str, tmp_path: Path) -> None:
    """SIGTERM to rank 0, rank 1 or both, at three moments of a step, beside a CPU hog:
    every process gone within the bound, exit 143, a checkpoint that resumes exactly."""
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        result = run_train_fault(
            tmp_path, "sigterm", target, "audit_ids=true", f"+model.fault_moment={moment}"
        )
    finally:
        hog.kill()
        hog.wait()
    _check_exit(result)
    assert result.returncode == 128 + signal.SIGTERM, result.output[-3000:]
    audit = read_audit(tmp_path / "run", 2)
    assert len(audit[0]) == len(audit[1])
    before, after = _stopped_and_resumed(tmp_path, result)
    assert before + after == Counter(EPOCH)
    record = {"target": target, "moment": moment, "exit_s": result.seconds_to_exit}
    print(json.dumps(record))


@pytest.mark.slow  # the same stop protocol as SIGTERM, which runs in the default tier
def test_ctrl_c_during_an_epoch_stops_every_rank(tmp_path: Path) -> None:
    result = run_train_fault(tmp_path, "sigint", 0)  # SIGINT to the job's process group
    _check_exit(result)
    assert "Traceback" not in result.output
    # Both ranks stop after the same step, save, and exit as interrupted (128 + SIGINT).
    assert "received SIGINT: stopping after this step" in result.output
    assert result.returncode == 128 + signal.SIGINT
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").resolve().name.startswith("stop-")


@pytest.mark.slow  # the stop protocol of SIGTERM, which runs in the default tier
def test_sigusr1_under_slurm_stops_saves_and_requeues(tmp_path: Path) -> None:
    """SLURM's ``--signal=USR1@...`` to rank 1: every rank stops after the same step,
    saves, and rank 0 runs ``scontrol requeue <job>`` (a stub on PATH records it)."""
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    calls = tmp_path / "scontrol_calls.txt"
    stub = stub_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    result = run_train_fault(tmp_path, "sigusr1", 1, "audit_ids=true", env=env)
    _check_exit(result)
    assert result.returncode == 0, result.output[-3000:]
    assert "received SIGUSR1: stopping after this step" in result.output
    assert calls.read_text().split("\n")[0] == "requeue 4242"  # once, by rank 0
    assert len(calls.read_text().strip().splitlines()) == 1
    before, after = _stopped_and_resumed(tmp_path, result)
    assert before + after == Counter(EPOCH)


MARKS = "+callbacks.stop_marks._target_=testing.harness.stop_marks.StopMarks"


def _check_all_gone(result: TrainFaultResult) -> None:
    """Every process of the job exited (within the harness's wait; no timing asserted)."""
    assert len(result.job_pids) == PROCESSES, result.output[-3000:]
    assert result.leftover_pids == [], result.output[-3000:]
    assert result.seconds_to_exit is not None


def _marks(path: Path) -> list[dict]:
    return [
        json.loads(line)
        for file in sorted(path.parent.glob(path.name + ".rank*"))
        for line in file.read_text().splitlines()
    ]


@pytest.mark.slow
def test_ctrl_c_skips_validation_says_it_stopped_and_prints_a_resume_command(tmp_path: Path):
    """Ctrl-C with a validation split: no validation after the stop (Lightning validates
    when should_stop is set mid-epoch), a summary that says the run stopped, and a resume
    command that works as printed."""
    marks = tmp_path / "marks" / "stop"
    result = run_train_fault(
        tmp_path, "sigint", 0, "audit_ids=true", "data.sizes.val_samples=8", MARKS,
        f"+callbacks.stop_marks.path={marks}",
    )  # fmt: skip
    _check_all_gone(result)
    assert result.returncode == 128 + signal.SIGINT, result.output[-3000:]
    events = _marks(marks)
    stopped_at = {m["rank"]: m["step"] for m in events if m["event"] == "step_end"}
    assert stopped_at == {0: 3, 1: 3}, events  # the signal in step 2: agreed at its end
    assert [m for m in events if m["event"] == "validation_start"] == []
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    stop = summary["stop"]
    assert stop["stopped_by"] == "SIGINT" and stop["stopped_after_step"] == 3
    assert Path(stop["stop_checkpoint"]).name == "stop-epoch0-step3.ckpt"
    assert "the run did not finish: stopped by SIGINT after optimizer step 3" in result.output
    assert stop["resume_command"] in result.output
    program, script, *overrides = shlex.split(stop["resume_command"])  # as a shell reads it
    assert (program, script) == ("python", "train.py")
    second = tmp_path / "resumed"
    # The helper runs debug=smoke, whose val_samples would override the checkpoint's.
    train(
        second,
        "trainer=ddp_cpu",
        "+model.fault=none",
        "audit_ids=true",
        "data.sizes.val_samples=8",
        *overrides,
    )
    before = Counter(i for rank in read_audit(tmp_path / "run", 2) for step in rank for i in step)
    after = Counter(i for rank in read_audit(second, 2) for step in rank for i in step)
    assert sum((before + after).values()) == len(set(before + after)), "no sample twice"
    assert "stop" not in json.loads((second / "summary.json").read_text())


@pytest.mark.slow  # the stop protocol's default-tier run is the SIGTERM test above
def test_a_stop_that_reaches_no_step_boundary_exits_at_the_deadline(tmp_path: Path) -> None:
    """Rank 0 gets SIGTERM, then its step never ends (rank 1 waits in the all-reduce):
    past stop.deadline_s every process of the job exits, nothing is saved over the newest
    checkpoint, and the log says how many steps a resume replays."""
    result = run_train_fault(
        tmp_path, "sigterm_hang", 0, "stop.deadline_s=3",
        "callbacks.checkpoint.every_n_train_steps=1", "callbacks.checkpoint.keep_last=-1",
    )  # fmt: skip
    _check_all_gone(result)
    assert result.returncode == 128 + signal.SIGTERM, result.output[-3000:]
    found = re.search(
        r"the stop on SIGTERM did not end within stop.deadline_s=3s \(waiting for a step "
        r"boundary; optimizer step (\d+) done\): exiting now; the newest checkpoint on disk is "
        r"(.+) \(optimizer step (\d+)\); a resume will replay (\d+) optimizer step\(s\)",
        result.output,
    )
    assert found, result.output[-3000:]
    step, path, saved, replay = found.groups()
    assert int(step) - int(saved) == int(replay)
    checkpoints = Path(path).parent
    assert not list(checkpoints.glob("stop-*")), "nothing saved at the deadline"
    newest = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)
    assert newest["global_step"] == int(saved)
    assert (checkpoints / "last.ckpt").resolve() == Path(path)


@pytest.mark.slow  # the default tier's in-process test covers the message and the status
def test_sigusr1_outside_slurm_is_a_clean_stop_that_says_nothing_requeues(
    tmp_path: Path,
) -> None:
    """SIGUSR1 without SLURM: every rank stops after the same step and saves; the run says
    that nothing requeues it and exits 138 (128 + SIGUSR1), with no failed.json; the
    checkpoint resumes exactly."""
    not_slurm = {"SLURM_JOB_ID": "", "SLURM_ARRAY_JOB_ID": ""}  # even where pytest runs in one
    result = run_train_fault(tmp_path, "sigusr1", 0, "audit_ids=true", env=not_slurm)
    _check_exit(result)
    assert result.returncode == 128 + signal.SIGUSR1, result.output[-3000:]
    assert (
        "SIGUSR1 asks for a SLURM requeue, but this process is not in a SLURM job "
        "(SLURM_JOB_ID is not set): nothing requeues it; stopped cleanly, exit status 138"
    ) in result.output
    assert "run failed" not in result.output
    assert not (tmp_path / "run" / "failed.json").exists()
    before, after = _stopped_and_resumed(tmp_path, result)
    assert before + after == Counter(EPOCH)
