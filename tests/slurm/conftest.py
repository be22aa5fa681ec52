"""The SLURM tier: tests against a running one-node cluster (``.ci/slurm/start.sh``, which
prints the ``SLURM_CONF`` to export). Every test here is marked ``slurm``; ``make test``
deselects them, ``make test-slurm`` runs them. Without a cluster they fail (the
``slurm_cluster`` fixture), naming the script that starts one."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A cluster whose node takes jobs, or a failure that says how to start one."""
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"no SLURM cluster ({error}): start one with .ci/slurm/start.sh (as root)")
    states = done.stdout.split()
    if done.returncode != 0 or not {"idle", "mix", "alloc"} & set(states):
        pytest.fail(
            f"no SLURM node takes jobs (sinfo: {done.stdout.strip() or done.stderr.strip()}): "
            "start one with .ci/slurm/start.sh (as root) and export the SLURM_CONF it prints"
        )
