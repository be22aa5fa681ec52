"""Which checkpoint a resume or an evaluation loads: ``ckpt_path`` itself, or, where a
``last.ckpt`` link dangles or its file does not load (a kill while it was being replaced,
a truncated copy), the newest valid checkpoint in the same directory; and reading one:
a file (:func:`read_checkpoint_file`, shared with ``odb-export``) or the shards of an
FSDP2 checkpoint directory into a module on CPU (:func:`load_sharded_weights`)."""

from __future__ import annotations

import logging
import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from odb_lightning.app.run_dir import AUTO_RESUME

log = logging.getLogger(__name__)

LAST_NAME = "last"
"""Stem of Lightning's ``last.ckpt`` (``last-v1.ckpt`` with its version counter)."""


CHECKPOINT_FIX = (
    ": pass as ckpt_path a checkpoint that train.py wrote (<run dir>/checkpoints/last.ckpt,"
    " a .ckpt file, or under FSDP2 a .ckpt directory of shards)"
)
"""The fix a refused ``ckpt_path`` is given."""


class NoValidCheckpointError(FileNotFoundError):
    """``ckpt_path`` names no checkpoint that loads (``last.ckpt``: nor does any beside it)."""


class NotACheckpointError(NoValidCheckpointError):
    """A path is not a checkpoint this package reads; the message says what it is instead.

    Attributes:
        path: The path.
        problem: What is wrong, as a predicate of the path (``is not a torch checkpoint``).
    """

    def __init__(self, path: Path, problem: str, fix: str = "") -> None:
        super().__init__(f"{path} {problem}{fix}")
        self.path, self.problem = path, problem


DISTRIBUTED_METADATA_FILENAME = "meta.pt"
"""What Lightning's ``ModelParallelStrategy`` saves beside the shards of a distributed
checkpoint: everything but the model and optimizer states (the hyperparameters too)."""
SHARDED_METADATA = (".metadata", DISTRIBUTED_METADATA_FILENAME)
"""What a complete FSDP2 checkpoint directory holds beside its ``*.distcp`` shards: torch's
distributed-checkpoint metadata and Lightning's ``meta.pt`` (all but the tensors)."""


def _load_reason(error: Exception) -> str:
    """The line of a ``torch.load`` error that says what is wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    unpickler = [line for line in lines if line.startswith("WeightsUnpickler error")]
    return (unpickler or lines or [repr(error)])[0]


def read_checkpoint_file(path: Path) -> dict[str, Any]:
    """A ``torch.save`` file of plain types, memory-mapped (``weights_only``: no code is
    unpickled).

    Raises:
        NotACheckpointError: ``path`` is missing or is not such a file.
    """
    if path.is_symlink() and not path.exists():
        raise NotACheckpointError(path, f"links to {os.readlink(path)}, which does not exist")
    if not path.is_file():
        raise NotACheckpointError(path, "does not exist")
    if not zipfile.is_zipfile(path):
        with path.open("rb") as file:
            started = file.read(4) == b"PK\x03\x04"  # a zip archive's first local header
        problem = (
            "is cut short (a zip archive without its end: a save or copy that did not finish)"
            if started
            else "is not a torch checkpoint (torch.save writes a zip archive)"
        )
        raise NotACheckpointError(path, problem)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError) as error:
        raise NotACheckpointError(path, f"does not load ({_load_reason(error)})") from None
    if not isinstance(loaded, dict):
        raise NotACheckpointError(path, f"holds a {type(loaded).__name__}, not a checkpoint")
    return loaded


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a loadable checkpoint, as a predicate (``does not load (...)``),
    or ``None`` when it is one: a file :func:`read_checkpoint_file` reads, or a sharded
    (FSDP2) checkpoint directory with its :data:`SHARDED_METADATA`."""
    if path.is_dir():
        missing = [name for name in SHARDED_METADATA if not (path / name).is_file()]
        return f"is a directory without {' and '.join(missing)}" if missing else None
    try:
        read_checkpoint_file(path)
    except NotACheckpointError as error:
        return error.problem
    return None


def load_sharded_weights(module: nn.Module, path: Path) -> None:
    """Read every shard of the FSDP2 checkpoint directory ``path`` into ``module`` (built,
    on CPU), in this one process: Lightning saves the module's state under
    ``"state_dict"``; a module is ``Stateful``, so torch's distributed checkpoint reads
    its tensors in place and hands them back through a strict ``load_state_dict``.

    Raises:
        NotACheckpointError: The shards do not fit ``module``.
    """
    import torch.distributed.checkpoint as dcp

    try:
        with warnings.catch_warnings():
            # One process reading every shard is the intent here, not a mistake.
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load({"state_dict": module}, checkpoint_id=path, no_dist=True)
    except (RuntimeError, dcp.CheckpointException) as error:
        raise NotACheckpointError(
            path, f"holds shards that do not fit its model: {error}"
        ) from None


def _is_last(path: Path) -> bool:
    return path.stem == LAST_NAME or path.stem.startswith(f"{LAST_NAME}-v")


def _mtime(path: Path) -> float:
    if path.is_dir():
        return max((p.stat().st_mtime for p in path.iterdir()), default=path.stat().st_mtime)
    return path.stat().st_mtime


def _newest_valid(directory: Path, *, with_last: bool) -> tuple[Path | None, list[str]]:
    """The newest checkpoint in ``directory`` that loads (``last.ckpt`` first where
    ``with_last``, then the others by modification time), and ``"<name> (it <why>)"`` for
    each one passed over on the way."""
    entries = sorted(directory.iterdir()) if directory.is_dir() else []
    candidates = [
        p
        for p in entries
        if p.suffix == ".ckpt" and not _is_last(p) and not p.name.startswith(".") and p.exists()
    ]
    ordered = sorted(candidates, key=_mtime, reverse=True)
    last = directory / f"{LAST_NAME}.ckpt"
    if with_last and (last.exists() or last.is_symlink()):
        ordered.insert(0, last)
    rejected: list[str] = []
    for candidate in ordered:
        why = checkpoint_problem(candidate)
        if why is None:
            return candidate, rejected
        rejected.append(f"{candidate.name} (it {why})")
    return None, rejected


def resolve_auto_checkpoint(checkpoint_dir: Path) -> str | None:
    """``ckpt_path=auto``: the newest valid checkpoint in ``checkpoint_dir`` (``last.ckpt``
    when it loads), each newer one that does not load named in a warning; ``None``, said
    in the log, when there is none: the run starts anew."""
    found, rejected = _newest_valid(checkpoint_dir, with_last=True)
    for skipped in rejected:
        log.warning("ckpt_path=auto: skipping %s in %s", skipped, checkpoint_dir)
    if found is None:
        log.info("ckpt_path=auto: no valid checkpoint in %s: starting a new run", checkpoint_dir)
        return None
    log.info("ckpt_path=auto: resuming from %s", found)
    return os.fspath(found)


def resolve_resume_checkpoint(
    ckpt_path: str | os.PathLike[str] | None, checkpoint_dir: Path | None = None
) -> str | None:
    """``ckpt_path``, unless it is a ``last.ckpt`` that does not load: then the newest
    valid ``*.ckpt`` (file or directory) in its directory, with a warning saying which one
    was taken and why. ``None`` is returned as it is; ``auto`` is
    :func:`resolve_auto_checkpoint` of ``checkpoint_dir`` (this run's).

    Raises:
        NotACheckpointError: ``ckpt_path`` (not a ``last.ckpt``) does not load, or is
            ``auto`` where there is no run directory to look in.
        NoValidCheckpointError: ``last.ckpt`` does not load and no checkpoint beside it
            does (the message names the directory and what was found there).
    """
    if ckpt_path is None:
        return None
    if os.fspath(ckpt_path) == AUTO_RESUME:
        if checkpoint_dir is None:
            raise NotACheckpointError(
                Path(AUTO_RESUME), "names no checkpoint here (train.py alone resumes from "
                "the newest checkpoint of its run directory)", CHECKPOINT_FIX,
            )  # fmt: skip
        return resolve_auto_checkpoint(checkpoint_dir)
    path = Path(ckpt_path)
    problem = checkpoint_problem(path)
    if problem is None:
        return os.fspath(ckpt_path)
    if not _is_last(path) or path.suffix != ".ckpt":
        raise NotACheckpointError(path, problem, CHECKPOINT_FIX)
    directory = path.parent
    candidate, rejected = _newest_valid(directory, with_last=False)
    if candidate is not None:
        log.warning(
            "resuming from %s instead of %s: it %s; it is the newest valid checkpoint in %s",
            candidate,
            path,
            problem,
            directory,
        )
        return os.fspath(candidate)
    entries = sorted(directory.iterdir()) if directory.is_dir() else []
    found = "; ".join(rejected) or (", ".join(p.name for p in entries) if entries else "nothing")
    raise NoValidCheckpointError(
        f"cannot resume from {path}: it {problem}, and no other checkpoint in {directory} "
        f"loads (found: {found}); start a new run without ckpt_path, or pass a valid "
        "checkpoint as ckpt_path"
    )


class CheckpointStrategyError(NoValidCheckpointError):
    """The trainer's strategy cannot read the checkpoint's format."""


def check_strategy_reads(ckpt_path: str, strategy: object) -> None:
    """Refuse a sharded (FSDP2) checkpoint directory under a strategy that reads single
    files only, before Lightning fails on it with ``IsADirectoryError``. (A single file
    under FSDP2 is read by Lightning's ``ModelParallelStrategy`` itself.)

    Raises:
        CheckpointStrategyError: Naming the strategies that read it.
    """
    from lightning.pytorch.strategies import ModelParallelStrategy

    if Path(ckpt_path).is_dir() and not isinstance(strategy, ModelParallelStrategy):
        raise CheckpointStrategyError(
            f"ckpt_path={ckpt_path} is a sharded (FSDP2) checkpoint directory, which this "
            f"trainer's strategy ({type(strategy).__name__}) cannot read: resume it with the "
            "FSDP2 strategy that wrote it, trainer=fsdp_cpu (CPU) or trainer=gpu8_fsdp "
            "(GPUs); eval.py and odb-export read it in one process"
        )
