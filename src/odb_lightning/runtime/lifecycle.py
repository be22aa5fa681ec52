"""Process hygiene shared by the worker and collate processes, and their bounded stop."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Mapping
from multiprocessing.process import BaseProcess

import torch

from odb_lightning.core.signals import reset_inherited_handlers

GRACEFUL_JOIN_S = 5.0
"""How long a child may take to exit on its own after a stop message, per step."""
FORCED_JOIN_S = 2.0
"""How long to wait after SIGTERM, then after SIGKILL."""


def _exit_with_parent(parent_sentinel: int) -> None:
    multiprocessing.connection.wait([parent_sentinel])
    # The main process is gone: nobody will read our output or stop us. Exit at once, even
    # if the main thread is blocked in a queue, a semaphore or a Gloo collective.
    os._exit(1)


def prepare_child() -> None:
    """Call first in every child process (started inside
    :func:`~odb_lightning.core.signals.signals_held`).

    No handler inherited from the parent runs here: SIGTERM gets its default action
    (``close()`` uses it), every other Python handler too, and SIGINT, SIGUSR1 and SIGUSR2
    are ignored: on Ctrl-C, or a scheduler's stop signal sent to every process of the job,
    the main process stops its children itself (``core/signals.py``). A daemon thread
    waits on the parent's sentinel and exits the process when the parent dies, so no
    child outlives a killed main process. Torch ops run single-threaded, as in DataLoader
    workers.
    """
    reset_inherited_handlers()
    torch.set_num_threads(1)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(
            target=_exit_with_parent, args=(parent.sentinel,), name="odb-parent-watch", daemon=True
        ).start()


def exited_child(processes: Mapping[str, BaseProcess]) -> tuple[str, BaseProcess] | None:
    """The first started child that has exited, by name, or ``None`` if all run.

    A child counts as exited when its sentinel is ready (the kernel closed its end of the
    pipe) or ``is_alive()`` says so. ``is_alive()`` alone is not enough: it asks
    ``waitpid``, which fails for a child whose exit status something else in this process
    already collected, and then reports the dead child alive.
    """
    sentinels = {process.sentinel: name for name, process in processes.items()}
    ready = multiprocessing.connection.wait(list(sentinels), timeout=0)
    for name, process in processes.items():
        if process.sentinel in ready or not process.is_alive():
            process.join(FORCED_JOIN_S)  # its exit code, once the kernel marks it exited
            return name, process
    return None


def describe_exit(process: BaseProcess) -> str:
    """How a child ended, from its exit code (unknown when collected elsewhere)."""
    code = process.exitcode
    if code is None:
        return "exited (its exit status was collected elsewhere)"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _join_all(processes: list[BaseProcess], wait_s: float) -> list[BaseProcess]:
    """Join all within ``wait_s`` seconds together; return those still alive."""
    deadline = time.monotonic() + wait_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    return [process for process in processes if process.is_alive()]


def stop_processes(processes: list[BaseProcess], *, graceful: bool) -> None:
    """Stop started children of this process within bounded time.

    If ``graceful`` (they were asked to exit), wait up to :data:`GRACEFUL_JOIN_S` for all
    of them together; then SIGTERM the rest, then SIGKILL, each with a bounded join.
    Processes that exited are closed (their handles released).
    """
    if graceful:
        alive = _join_all(processes, GRACEFUL_JOIN_S)
    else:
        alive = [process for process in processes if process.is_alive()]
    for process in alive:
        process.terminate()
    alive = _join_all(alive, FORCED_JOIN_S)
    for process in alive:
        process.kill()
    alive = _join_all(alive, FORCED_JOIN_S)
    for process in processes:
        if process not in alive:
            process.close()
