"""How the main process tells that a loader child has exited (``runtime/lifecycle.py``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event as EventType

import psutil
import pytest

from odb_lightning.runtime.lifecycle import describe_exit, exited_child, stop_processes


@pytest.fixture
def child() -> Iterator[multiprocessing.Process]:
    process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    process.start()
    yield process
    stop_processes([process], graceful=False)


def test_a_running_child_has_not_exited(child: multiprocessing.Process) -> None:
    assert exited_child({"worker 0": child}) is None


def test_a_killed_child_is_named_with_its_signal(child: multiprocessing.Process) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)  # waits for the event, not for time
    assert exited_child({"collate process": child}) == ("collate process", child)
    assert describe_exit(child) == "was killed by SIGKILL"


def test_a_child_reaped_elsewhere_still_counts_as_exited(child: multiprocessing.Process) -> None:
    os.kill(child.pid, signal.SIGKILL)
    os.waitpid(child.pid, 0)  # another part of the process collects its exit status
    # The control: is_alive() alone is fooled (waitpid fails, so it reports the child alive).
    assert child.is_alive()
    assert exited_child({"worker 0": child}) == ("worker 0", child)
    assert describe_exit(child) == "exited (its exit status was collected elsewhere)"


def _deaf_to_sigterm(ready: EventType) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def test_a_child_that_ignores_sigterm_is_killed_before_stop_returns() -> None:
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    process = context.Process(target=_deaf_to_sigterm, args=(ready,))
    process.start()
    assert ready.wait(60), "the child never installed its handler"
    pid = process.pid
    stop_processes([process], graceful=False)  # SIGTERM, ignored; then SIGKILL
    assert not psutil.pid_exists(pid), "joined after SIGKILL: gone, not a zombie"
