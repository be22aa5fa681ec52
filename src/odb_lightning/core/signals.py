"""Signal hygiene of the processes a rank starts (loader workers, the collate process,
the length pass's workers): they never run a handler inherited from their parent.

A forked child inherits its parent's Python signal handlers: Lightning's, the user's, and
under Hydra's submitit launcher submitit's own SIGUSR2 handler, which checkpoints and
requeues the job from whichever process it runs in (in a loader worker: a second writer of
the same file, and a job that dies instead of stopping). The parent decides how its job
stops and stops its children itself, so in a child:

* every Python handler goes back to the default action, SIGTERM included (the parent's
  bounded ``close()`` sends it);
* the stop signals a scheduler sends to every process of the job (:data:`IGNORED`: Ctrl-C's
  SIGINT, SLURM's and submitit's SIGUSR1 and SIGUSR2) are ignored.

No signal can reach a child between its start and that reset: the parent starts children
inside :func:`signals_held`, which blocks :data:`HELD` in the starting thread (a forked
child inherits that mask), and the child unblocks them in :func:`reset_inherited_handlers`,
after the reset. A signal sent meanwhile waits, pending, and then meets the child's own
disposition. (A spawned child runs a new interpreter: it inherits no Python handler.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

IGNORED = (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
"""Stop signals a child ignores: its parent stops it."""

_SYNCHRONOUS = {
    signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
    signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGSYS, signal.SIGCHLD,
}  # fmt: skip
HELD = frozenset(signal.valid_signals()) - _SYNCHRONOUS
"""Signals blocked while a child starts: every one that can carry a handler from outside,
but neither a fault the child raises itself nor SIGCHLD."""


@contextmanager
def signals_held() -> Iterator[None]:
    """Block :data:`HELD` in this thread while its body starts child processes; restore the
    mask after (a signal that came meanwhile is then delivered here as usual)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def reset_inherited_handlers(*_: object) -> None:
    """In a child, first: every inherited Python handler back to the default action,
    :data:`IGNORED` ignored, then :data:`HELD` unblocked (module docstring). Takes and
    ignores arguments, so that it serves as a ``DataLoader``'s ``worker_init_fn``."""
    for signum in HELD:
        if callable(signal.getsignal(signum)):
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
