"""Process-tree probes and bounded waits: what a fault check needs to tell that every
process of a job is gone, and what a soak needs to tell that nothing leaks."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import psutil


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (none once ``pid`` has exited)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening_sockets(pids: Iterable[int]) -> list[dict[str, Any]]:
    """Every listening inet socket of ``pids``: ``{"pid", "ppid", "host", "port"}``."""
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            connections, ppid = process.net_connections(kind="inet"), process.ppid()
        except psutil.NoSuchProcess:
            continue
        for connection in connections:
            if connection.status == psutil.CONN_LISTEN:
                host, port = connection.laddr.ip, connection.laddr.port
                found.append({"pid": pid, "ppid": ppid, "host": host, "port": port})
    return found


def resource_sample() -> dict[str, int]:
    """This process's open file descriptors and RSS, its live descendants and the largest
    RSS among them, and the PSS of it and them together (proportional set size: forked
    children share most pages with their parent; a sum of RSS would count them twice)."""
    me = psutil.Process()
    children = me.children(recursive=True)
    pss, child_rss = me.memory_full_info().pss, [0]
    for child in children:
        try:
            memory = child.memory_full_info()
        except psutil.NoSuchProcess:
            continue  # exited since the listing: it holds no memory any more
        pss += memory.pss
        child_rss.append(memory.rss)
    return {
        "open_fds": me.num_fds(),
        "children": len(children),
        "rss_bytes": me.memory_info().rss,
        "max_child_rss_bytes": max(child_rss),
        "tree_pss_bytes": pss,
    }


def _running(pids: list[int]) -> list[psutil.Process]:
    """Those of ``pids`` still running (an exited, unreaped zombie does not count)."""
    running = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            continue
    return running


def wait_all_gone(pids: list[int], timeout_s: float) -> tuple[float | None, list[int]]:
    """``(time.monotonic() when all had exited or None, those still running at the end)``."""
    deadline = time.monotonic() + timeout_s
    running = _running(pids)
    while running and time.monotonic() < deadline:
        psutil.wait_procs(running, timeout=0.05)
        running = _running([process.pid for process in running])
    return (None if running else time.monotonic()), [process.pid for process in running]


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """PIDs still running after up to ``timeout_s`` seconds (zombies count as gone)."""
    return wait_all_gone(pids, timeout_s)[1]


def kill_leftovers(pids: list[int]) -> None:
    """SIGKILL processes that outlived their job (after they were counted), so that one
    failed check does not leave them running under the rest of the suite."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # exited since it was counted


def kill_alive(processes: Iterable[Any]) -> None:
    """Kill (and reap) every ``multiprocessing`` process of a job still running: what a
    rank runner does last, so that no rank outlives its test."""
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5)
