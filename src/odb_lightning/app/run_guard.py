"""One run at a time in a run directory, and no writes through links placed there.

``conf/train.yaml`` installs :class:`RunDirGuard` as a Hydra callback: at the start of a
run, before Hydra writes its ``.hydra`` files and opens the job log there, it

1. refuses a run directory that holds a symbolic link where the run writes
   (:func:`planted_links`): ``summary.json``, the job log, ``checkpoints/`` and the files
   under it would otherwise be written into whatever the link points to;
2. takes the run directory's lock (:class:`RunDirLock`, ``<run dir>/.run.lock``) in the
   job's first process (global rank 0): a second run started in the same directory (a
   requeued attempt while the old one still runs, a job script started twice) exits 1 with
   a message naming the holder, instead of training beside it into the same checkpoint
   and audit files. The lock is an advisory ``flock`` that the kernel drops when its
   holder dies, however it dies; the holder's pid, host and start time are written into
   the file, and emptied when the run ends. A file still naming a holder that no longer
   holds the lock is a dead run's: it is taken over, and the log says so.

The ranks Lightning's launcher starts, and ranks > 0 under torchrun or srun, check the
links but take no lock. ``flock`` on NFS is a POSIX lock on the server (Linux >= 2.6.12).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import logging
import os
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from typing_extensions import override

from odb_lightning.app.run_dir import CHECKPOINT_DIR_NAME, lightning_rank

log = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
"""The run directory's lock file (kept; empty while no run holds it)."""

ALLOWED_LINKS = (f"{CHECKPOINT_DIR_NAME}/last.ckpt",)
"""Links the run makes itself (``last.ckpt`` names a checkpoint beside it)."""

SKIPPED_DIRS = ("wandb",)
"""Directories another program keeps its own links in (W&B's ``latest-run``)."""


class RunDirInUseError(RuntimeError):
    """Another run holds the run directory; the message names it."""


class PlantedLinkError(RuntimeError):
    """The run directory holds a symbolic link where the run writes; the message names it."""


class RunDirLock:
    """The advisory lock of a run directory (the module docstring).

    Args:
        run_dir: The run directory (created if missing).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Hold the lock, or raise naming its holder.

        Raises:
            RunDirInUseError: A live process holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise PlantedLinkError(_link_message(self.path)) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirInUseError(
                f"the run directory {self.path.parent} is in use by another run: "
                f"{describe_holder(holder)} holds {self.path}. Wait for it to end (a resume "
                "with ckpt_path=auto then continues it), or give this run another "
                "hydra.run.dir"
            ) from None
        previous = _read_holder(fd)
        if previous:
            log.warning(
                "taking over the lock of the run directory %s: %s ended without releasing "
                "it (killed, or its machine lost) and holds it no longer",
                self.path.parent, describe_holder(previous),
            )  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_entry()).encode() + b"\n", 0)
        self._fd = fd

    def release(self) -> None:
        """Empty the file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def holder_entry() -> dict[str, Any]:
    """What the lock file says about its holder: pid, host, start time."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def describe_holder(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host node1 (started 2026-12-06T15:00:00+00:00)``."""
    if not holder:
        return "a process that wrote nothing into the lock yet"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (started {holder.get('started')})"


def _read_holder(fd: int) -> dict[str, Any] | None:
    content = os.pread(fd, 4096, 0)
    if not content.strip():
        return None
    try:
        holder = json.loads(content)
    except ValueError:
        return {"pid": "?", "host": "?", "started": f"unreadable entry {content[:40]!r}"}
    return holder if isinstance(holder, dict) else None


def _link_message(link: Path) -> str:
    return (
        f"the run directory holds a symbolic link where the run writes: {link} -> "
        f"{os.readlink(link)}. A run writes only into its own directory: remove the link "
        f"(rm {link}), or give the run another hydra.run.dir"
    )


def planted_links(run_dir: Path) -> list[Path]:
    """The symbolic links under ``run_dir`` other than those the run makes itself
    (:data:`ALLOWED_LINKS`; W&B's directory is its own, :data:`SKIPPED_DIRS`)."""
    found = []
    for parent, dirs, files in os.walk(run_dir):
        here = Path(parent)
        for name in [*dirs, *files]:
            path = here / name
            relative = path.relative_to(run_dir).as_posix()
            if path.is_symlink() and relative not in ALLOWED_LINKS:
                found.append(path)
        if here == run_dir:
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
    return found


def check_no_planted_links(run_dir: Path) -> None:
    """Refuse a run directory with a link where the run writes.

    Raises:
        PlantedLinkError: Naming the first such link and the fix.
    """
    if not run_dir.is_dir():
        return
    links = planted_links(run_dir)
    if links:
        more = f" (and {len(links) - 1} more: {', '.join(map(str, links[1:]))})"
        raise PlantedLinkError(_link_message(links[0]) + (more if len(links) > 1 else ""))


class RunDirGuard(Callback):
    """Hydra callback: the checks of the module docstring at the start of a run."""

    def __init__(self) -> None:
        self._lock: RunDirLock | None = None

    @override
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra turns a callback's exception into a warning and runs the job anyway: a
        # refusal exits here, before the job, with the message alone.
        try:
            self._guard(Path(str(config.hydra.run.dir)).absolute())
        except (RunDirInUseError, PlantedLinkError) as error:
            sys.stderr.write(f"{type(error).__name__}: {error}\n")
            raise SystemExit(1) from None

    def _guard(self, run_dir: Path) -> None:
        check_no_planted_links(run_dir)
        if lightning_rank() != 0:
            return  # a rank the job's first process (or torchrun, srun) started
        self._lock = RunDirLock(run_dir)
        self._lock.acquire()
        # A stop leaves through SystemExit, which passes over on_run_end.
        atexit.register(self._lock.release)

    @override
    def on_run_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self._lock is not None:
            self._lock.release()
