"""Faults in a real 2-rank ``python train.py trainer=ddp_cpu`` run of this checkout:
the run is a subprocess in its own session, as a user or a scheduler starts it; the fault
comes from :class:`~testing.harness.fault_injection.FaultInjectingModule` inside it.

A result gives the exit code, the output of both ranks (rank 1 writes to rank 0's
stdout and stderr), the seconds from the fault until every process of the job (both
ranks, their loader workers and collate processes, recorded at the first step) had
exited, and the PIDs that outlived the job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testing.harness.processes import kill_leftovers, wait_all_gone

ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root (``testing/harness/`` is two levels below it)."""
TRAIN_SCRIPT = ROOT / "train.py"
"""``train.py`` of this checkout (the script and its ``conf/`` are not part of the package)."""
FAULT_MODULE = "testing.harness.fault_injection.FaultInjectingModule"
EXIT_BOUND_S = 30.0
"""Every process of the job exits within this many seconds of the fault."""


@dataclass
class TrainFaultResult:
    """One faulted ``train.py`` run.

    Attributes:
        returncode: Exit code of the launched process (rank 0).
        output: Its stdout and stderr (rank 1's too).
        seconds_to_exit: From the fault until every process of the job had exited
            (``None``: some had not within the bound).
        job_pids: PIDs of every process of the job, recorded at the first training step.
        leftover_pids: Those still running :data:`EXIT_BOUND_S` after the fault.
        probe_dir: Where the run's probe files are.
    """

    returncode: int
    output: str
    seconds_to_exit: float | None
    job_pids: list[int]
    leftover_pids: list[int]
    probe_dir: Path


def train_command(
    train_script: Path,
    run_dir: Path,
    probe_dir: Path,
    fault: str,
    fault_rank: int,
    fault_step: int,
    overrides: tuple[str, ...],
) -> list[str]:
    return [
        sys.executable,
        str(train_script),
        "debug=smoke",
        "trainer=ddp_cpu",
        f"hydra.run.dir={run_dir}",
        *(
            []
            if any(o.startswith("data.sizes.val_samples=") for o in overrides)
            else ["data.sizes.val_samples=0"]
        ),
        f"model._target_={FAULT_MODULE}",
        f"+model.probe_dir={probe_dir}",
        f"+model.fault={fault}",
        f"+model.fault_rank={fault_rank}",
        f"+model.fault_step={fault_step}",
        *overrides,
    ]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


OUTCOME_LINE = re.compile(
    r"\w+(?:Error|Exception): .*|\[rank: \d\] Received SIGTERM.*|Detected KeyboardInterrupt.*"
    r"|.*Child process with PID \d+ terminated with code.*"
)


def outcome_lines(output: str) -> list[str]:
    """The lines of ``output`` that say how a rank ended: its exception, the signal it got,
    or Lightning's launcher killing the other ranks (progress-bar prefixes removed)."""
    found = []
    for line in re.split(r"[\r\n]", output):
        match = OUTCOME_LINE.search(line)
        if match and match.group(0) not in found:
            found.append(match.group(0)[:240])
    return found


def _job_pids(probe_dir: Path) -> list[int]:
    pids: set[int] = set()
    for probe in probe_dir.glob("probe_rank*.json"):
        recorded = json.loads(probe.read_text())
        pids.update([recorded["pid"], *recorded["descendants"]])
    return sorted(pids)


def run_train_fault(
    work_dir: Path,
    fault: str,
    fault_rank: int,
    *overrides: str,
    fault_step: int = 2,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 180.0,
) -> TrainFaultResult:
    """Run :data:`TRAIN_SCRIPT` with ``fault`` on ``fault_rank`` at ``fault_step`` (``"none"``:
    no fault, the seconds are then counted from the run's exit).

    The run writes into ``work_dir/run`` (its Hydra output directory), probes into
    ``work_dir/probe``; its output goes to ``work_dir/output.log``. It runs in ``cwd``
    (default: the checkout's root) with ``env`` over this process's environment. A run
    still going after ``timeout_s`` is killed with its whole session, and the error says so.
    """
    run_dir, probe_dir = work_dir / "run", work_dir / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    command = train_command(
        TRAIN_SCRIPT, run_dir, probe_dir, fault, fault_rank, fault_step, overrides
    )
    environment = {**os.environ, **(env or {})}
    log_path = work_dir / "output.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=cwd or ROOT, env=environment, stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C (SIGINT to the process group) reaches the job only
            # A shell starts background jobs with SIGINT ignored, and Python then keeps it
            # ignored: give the run the disposition of a terminal's foreground job.
            preexec_fn=_default_sigint,
        )  # fmt: skip
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise AssertionError(
                f"train.py did not exit within {timeout_s}s: {log_path.read_text()[-3000:]}"
            ) from None
    exited_at = time.monotonic()
    fault_file = probe_dir / "fault.json"
    fault_at = json.loads(fault_file.read_text())["at"] if fault_file.exists() else exited_at
    pids = _job_pids(probe_dir)
    remaining_s = max(0.0, fault_at + EXIT_BOUND_S - time.monotonic())
    all_gone_at, leftover = wait_all_gone(pids, remaining_s)
    kill_leftovers(leftover)
    return TrainFaultResult(
        returncode=returncode,
        output=log_path.read_text(errors="replace"),
        seconds_to_exit=None if all_gone_at is None else all_gone_at - fault_at,
        job_pids=pids,
        leftover_pids=leftover,
        probe_dir=probe_dir,
    )
