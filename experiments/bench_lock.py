"""The lock that keeps timed benchmarks apart on a shared machine.

Every study that times something takes ``--lock FILE`` and holds ``flock(FILE)`` around
each timed run: the same lock as ``flock(1)``, so a shell job wrapped in
``flock FILE command`` waits for them too, and no two timed runs overlap.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def bench_lock(path: Path | None) -> Iterator[None]:
    """Hold ``flock(path)`` for the block; ``None`` holds nothing."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
