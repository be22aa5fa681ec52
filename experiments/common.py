"""What the studies share: the ``train.py`` runner, the results meta and the bench lock.

Standard library only: the GPU study runs on machines that have little besides torch,
transformers and Lightning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def train_command(run_dir: Path, overrides: Sequence[str]) -> list[str]:
    """``python train.py`` with ``overrides``, writing into ``run_dir`` (run from ``ROOT``)."""
    return [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides]


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The ``summary.json`` a finished ``train.py`` run wrote."""
    return json.loads((run_dir / "summary.json").read_text())


def run_train(run_dir: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """Run ``train.py`` with ``overrides`` in a fresh ``run_dir``; return its summary.

    Raises:
        RuntimeError: The run failed (the message holds the end of its stderr).
    """
    shutil.rmtree(run_dir, ignore_errors=True)  # no earlier run's files (CSV versions, audits)
    done = subprocess.run(
        train_command(run_dir, overrides), cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"train.py {' '.join(overrides)} failed (exit {done.returncode}):\n"
            f"{done.stderr[-4000:]}"
        )
    return read_summary(run_dir)


def command_line() -> str:
    """How this process was started: ``python -m experiments.<study>.run <arguments>``."""
    spec = sys.modules["__main__"].__spec__
    program = ["-m", spec.name] if spec is not None else [sys.argv[0]]
    return shlex.join(["python", *program, *sys.argv[1:]])


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The checkout's commit, ``-dirty`` when the working tree differs from it (``None``
    outside a git checkout or without git)."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def results_meta(**fields: Any) -> dict[str, Any]:
    """The ``meta`` of a study's ``results.json``: when, how and where it ran (date,
    command, commit, machine, CPUs, Python, torch and Lightning), then the study's own
    ``fields``."""
    return {
        "date": date.today().isoformat(),
        "command": command_line(),
        "git_commit": git_commit(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "lightning": _version("lightning"),
        **fields,
    }


@contextlib.contextmanager
def bench_lock(path: Path | None) -> Iterator[None]:
    """Hold ``flock(path)`` for the block (``None``: hold nothing).

    Every study that times something takes ``--lock FILE`` and holds this lock around
    each timed run: the same lock as ``flock(1)``, so a shell job wrapped in
    ``flock FILE command`` waits for them too, and no two timed runs overlap.
    """
    if path is None:
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
