"""Ending the processes a rank started: killed at a stop's deadline, or waited for and
reaped at the end of a fit (the other ranks of Lightning's launcher, loader processes)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence

import psutil


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
