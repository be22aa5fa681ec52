"""A job's processes end together, and a run directory holds one run: a real 2-rank
``train.py trainer=ddp_cpu`` run (``debug=smoke``), started in its own session as a
scheduler starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from odb_lightning.app.run_guard import LOCK_FILE, RunDirLock
from testing.harness.processes import kill_leftovers, wait_all_gone
from testing.harness.train_faults import EXIT_BOUND_S, TRAIN_SCRIPT

ROOT = TRAIN_SCRIPT.parent
START_BOUND_S = 300.0
"""How long rank 0 may take to start rank 1 (imports on a loaded machine)."""
GONE_BOUND_S = 120.0
"""How long rank 1 may take to be gone once rank 0 is (its imports, on a loaded machine)."""


def _start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    command = [
        sys.executable, str(TRAIN_SCRIPT), "debug=smoke", "trainer=ddp_cpu",
        f"hydra.run.dir={run_dir}", *overrides,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _wait_for_rank1(rank0: subprocess.Popen) -> psutil.Process:
    """Rank 1, once rank 0's launcher has started it (rank 0 then waits in the process
    group's start-up: the setup a preemption often lands in)."""
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline and rank0.poll() is None:
        for child in psutil.Process(rank0.pid).children():
            if "train.py" in " ".join(child.cmdline()):
                return child
        time.sleep(0.05)  # polling for the event (rank 1's start), not waiting out a race
    raise AssertionError(f"rank 0 started no rank 1 within {START_BOUND_S}s")


def _job_pids(run_dir: Path) -> list[int]:
    """Every process whose command line names ``run_dir`` (the job's ranks)."""
    named = psutil.process_iter(["cmdline"])
    return [p.pid for p in named if str(run_dir) in " ".join(p.info["cmdline"] or [])]


def test_sigterm_to_rank0_during_setup_ends_every_rank(tmp_path: Path) -> None:
    rank0 = _start(tmp_path / "run")
    try:
        rank1 = _wait_for_rank1(rank0)
        os.kill(rank0.pid, signal.SIGTERM)
        rank0.wait(timeout=EXIT_BOUND_S)  # reaped here, so its status is its own
        # Rank 1 dies with it, or, if it was still importing, exits once it finds its
        # launcher gone: as long as its imports take on a loaded machine.
        _, left = wait_all_gone([rank1.pid], GONE_BOUND_S)
    finally:
        kill_leftovers(_job_pids(tmp_path))
        output = rank0.communicate(timeout=EXIT_BOUND_S)[0]
    assert left == [], output[-3000:]
    # Before the fit's stop handler: the default action (-15); with one installed, 143.
    stopped = (-signal.SIGTERM, 128 + signal.SIGTERM)
    assert rank0.returncode in stopped, (rank0.returncode, output[-3000:])


@pytest.mark.slow  # fails at start-up; the lock's rules are tested in tests/unit/app
def test_a_second_run_in_a_held_run_directory_exits_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    held = RunDirLock(run_dir)
    held.acquire()  # this test process plays the first run
    try:
        second = _start(run_dir, "ckpt_path=auto")
        output = second.communicate(timeout=START_BOUND_S)[0]
    finally:
        held.release()
    assert second.returncode == 1, output[-3000:]
    assert f"is in use by another run: pid {os.getpid()} on host" in output
    assert f"holds {run_dir / LOCK_FILE}" in output
    assert not list(run_dir.glob(".hydra*")), "the second run wrote into the directory"
    assert not (run_dir / "train.log").exists()


@pytest.mark.slow  # fails at start-up; the link rules are tested in tests/unit/app
def test_a_link_planted_in_the_run_directory_is_refused(tmp_path: Path) -> None:
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("keep me\n")
    (run_dir / "summary.json").symlink_to(victim)
    done = _start(run_dir)
    output = done.communicate(timeout=START_BOUND_S)[0]
    assert done.returncode == 1, output[-3000:]
    assert f"symbolic link where the run writes: {run_dir / 'summary.json'} -> {victim}" in output
    assert victim.read_text() == "keep me\n"
