"""The SLURM requeue a stop on SIGUSR1 or SIGUSR2 asks for (``graceful_stop.py``): which job
it names, the command, and what a stop outside SLURM says instead."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess

log = logging.getLogger(__name__)


def slurm_job_to_requeue(environ: dict[str, str] | None = None) -> str | None:
    """The SLURM job a requeue names (``<array job>_<task>`` for an array task, which
    submitit's sweeps are), or ``None`` outside a SLURM job."""
    env = os.environ if environ is None else environ
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{array_task}" if array_job and array_task else env.get("SLURM_JOB_ID")
    return job if job and re.fullmatch(r"[0-9_]+", job) else None


def not_requeued_message(signum: signal.Signals, code: int) -> str:
    """What a stop on a requeue signal outside SLURM says."""
    return (
        f"{signum.name} asks for a SLURM requeue, but this process is not in a SLURM job "
        f"(SLURM_JOB_ID is not set): nothing requeues it; stopped cleanly, exit status {code}"
    )


REQUEUE_TIMEOUT_S = 30.0
"""How long ``scontrol requeue`` may take."""


def requeue_slurm_job(job: str) -> int:
    """``scontrol requeue <job>``; the command's exit status (1 when it did not answer
    within :data:`REQUEUE_TIMEOUT_S`)."""
    try:
        done = subprocess.run(
            ["scontrol", "requeue", job],
            capture_output=True, text=True, check=False, timeout=REQUEUE_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        log.error("scontrol requeue %s did not answer within %gs", job, REQUEUE_TIMEOUT_S)
        return 1
    if done.returncode == 0:
        log.warning("requeued SLURM job %s", job)
    else:
        log.error("scontrol requeue %s failed (%d): %s", job, done.returncode, done.stderr.strip())
    return done.returncode
