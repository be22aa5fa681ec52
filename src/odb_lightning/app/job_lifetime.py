"""Every process of a job ends when one of its ranks dies, from the first moment on.

Lightning's launcher starts the other ranks of a node as child processes of the node's
first one (rank 0 on one node). It watches them (a child that fails kills the rest within
its 5 s poll), but nothing ends a child whose parent died: a rank 0 killed during
start-up (SLURM's preemption often lands there, before any stop handler is installed)
left rank 1 waiting forever for a store that was gone.

So a rank that Lightning's launcher started asks the kernel to kill it when its parent
dies (Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; elsewhere a thread that polls the
parent's pid), then checks that the parent is still the process that started it (the
parent may have died while the child imported). Which process started it is told through
the environment the launcher copies into its children (:data:`LAUNCHER_PID`), set by
:func:`mark_launcher` in every process that may launch. A rank that torchrun or srun
started has its own agent or step daemon to end it, and is left alone; so is a process
that a shell started (``nohup python train.py &`` outlives the shell).

The loader processes of a rank watch their rank the same way (``runtime/lifecycle.py``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger(__name__)

LAUNCHER_PID = "ODB_LAUNCHER_PID"
"""Environment variable: the pid of the process whose children (the ranks Lightning's
launcher starts) must die with it. Set by :func:`mark_launcher`, read by
:func:`end_with_launcher`; not a setting."""

PR_SET_PDEATHSIG = 1
"""``prctl`` option (``<linux/prctl.h>``): the signal this process gets when its parent
thread exits."""

PARENT_POLL_S = 0.5
"""How often the fallback thread (not Linux) checks that the parent still lives."""

LAUNCHER_GONE_EXIT_CODE = 128 + signal.SIGKILL
"""Exit status of a rank whose launcher was already gone when it started (as if killed)."""


def mark_launcher() -> None:
    """Name this process as the one whose launched children die with it (call before
    ``trainer.fit``, in whatever process may start ranks: they copy its environment)."""
    os.environ[LAUNCHER_PID] = str(os.getpid())


def launched_by_parent() -> int | None:
    """The launcher's pid when this process is a rank Lightning's launcher started (its
    ``LOCAL_RANK`` above 0 and :data:`LAUNCHER_PID` set), else ``None``."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None or os.environ.get("LOCAL_RANK", "0") == "0":
        return None
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agent ends its own workers
        return None
    return int(launcher)


def end_with_launcher() -> None:
    """In a rank Lightning's launcher started: die with the launcher (module docstring).
    Call first in the application; a no-op in every other process."""
    launcher = launched_by_parent()
    if launcher is None or launcher == os.getpid():
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(
            target=_exit_when_orphaned, args=(launcher,), name="odb-launcher-watch", daemon=True
        ).start()
    # Armed from here on; the launcher may have died before (while this process imported).
    if os.getppid() != launcher:
        _exit_orphaned(launcher)


def _exit_when_orphaned(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(PARENT_POLL_S)
    _exit_orphaned(launcher)


def _exit_orphaned(launcher: int) -> None:
    os.write(
        2,
        f"rank {os.environ.get('LOCAL_RANK')} (pid {os.getpid()}): the process that started "
        f"it (pid {launcher}, the job's first rank) is gone: exiting\n".encode(),
    )
    os._exit(LAUNCHER_GONE_EXIT_CODE)
