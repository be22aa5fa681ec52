"""Which checkpoint a resume loads: ``ckpt_path`` itself, or, where a ``last.ckpt`` link
dangles or its file does not load (a kill while it was being replaced, a truncated copy),
the newest valid checkpoint in the same directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

LAST_NAME = "last"
"""Stem of Lightning's ``last.ckpt`` (``last-v1.ckpt`` with its version counter)."""


class NoValidCheckpointError(FileNotFoundError):
    """``last.ckpt`` does not load and no other checkpoint beside it does."""


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a loadable checkpoint, or ``None`` when it is one: a file that
    ``torch.load(weights_only=True, mmap=True)`` reads, or a sharded (FSDP2) checkpoint
    directory with its ``.metadata`` and ``meta.pt``."""
    if path.is_symlink() and not path.exists():
        return f"it links to {os.readlink(path)}, which does not exist"
    if not path.exists():
        return "it does not exist"
    if path.is_dir():
        missing = [name for name in (".metadata", "meta.pt") if not (path / name).is_file()]
        return f"the checkpoint directory lacks {', '.join(missing)}" if missing else None
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - any failure to load makes it invalid
        return f"it does not load ({type(error).__name__}: {error})"
    return None


def _is_last(path: Path) -> bool:
    return path.stem == LAST_NAME or path.stem.startswith(f"{LAST_NAME}-v")


def _mtime(path: Path) -> float:
    if path.is_dir():
        return max((p.stat().st_mtime for p in path.iterdir()), default=path.stat().st_mtime)
    return path.stat().st_mtime


def resolve_resume_checkpoint(ckpt_path: str | os.PathLike[str] | None) -> str | None:
    """``ckpt_path``, unless it is a ``last.ckpt`` that does not load: then the newest
    valid ``*.ckpt`` (file or directory) in its directory, with a warning saying which one
    was taken and why. Other paths and ``None`` are returned as they are (Lightning
    reports their errors).

    Raises:
        NoValidCheckpointError: ``last.ckpt`` does not load and no checkpoint beside it
            does (the message names the directory and what was found there).
    """
    if ckpt_path is None:
        return None
    path = Path(ckpt_path)
    if not _is_last(path) or path.suffix != ".ckpt":
        return os.fspath(ckpt_path)
    problem = checkpoint_problem(path)
    if problem is None:
        return os.fspath(ckpt_path)
    directory = path.parent
    entries = sorted(directory.iterdir()) if directory.is_dir() else []
    candidates = [
        p
        for p in entries
        if p.suffix == ".ckpt" and not _is_last(p) and not p.name.startswith(".") and p.exists()
    ]
    rejected: list[str] = []
    for candidate in sorted(candidates, key=_mtime, reverse=True):
        why = checkpoint_problem(candidate)
        if why is None:
            log.warning(
                "resuming from %s instead of %s: %s; it is the newest valid checkpoint in %s",
                candidate,
                path,
                problem,
                directory,
            )
            return os.fspath(candidate)
        rejected.append(f"{candidate.name} ({why})")
    found = "; ".join(rejected) or (", ".join(p.name for p in entries) if entries else "nothing")
    raise NoValidCheckpointError(
        f"cannot resume from {path}: {problem}, and no other checkpoint in {directory} "
        f"loads (found: {found}); start a new run without ckpt_path, or pass a valid "
        "checkpoint as ckpt_path"
    )
