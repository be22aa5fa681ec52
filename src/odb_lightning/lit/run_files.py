"""The files a run writes into its directory, opened without following a symbolic link.

A run writes only into its own directory. A link placed there (``summary.json`` pointing
at a file elsewhere) would make the run write into its target: the application refuses a
run directory that holds one when the run starts (``app/run_guard.py``), and every file
this package writes there is opened with ``O_NOFOLLOW``, so a link placed while the run
goes is refused too, naming it, instead of written through.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TextIO


class RunFileLinkError(RuntimeError):
    """A file of the run is a symbolic link; the message names it and its target."""


def open_run_file(path: str | Path, mode: str = "w") -> TextIO:
    """``path`` opened for writing text (``"w"``: from empty, ``"a"``: appended), never
    through a symbolic link.

    Raises:
        RunFileLinkError: ``path`` is a symbolic link.
    """
    if mode not in ("w", "a"):
        raise ValueError(f"mode must be 'w' or 'a', got {mode!r}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if mode == "a" else os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise RunFileLinkError(
            f"{path} is a symbolic link (to {os.readlink(path)}); a run writes only into its "
            "own directory: remove the link",
        ) from None
    return os.fdopen(fd, mode, encoding="utf-8")


def write_run_file(path: str | Path, text: str) -> None:
    """Write ``text`` into ``path`` (:func:`open_run_file`)."""
    with open_run_file(path) as file:
        file.write(text)
