"""Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` link that never dangles.

Lightning 2.6 (``save_last="link"``) deletes the previous top-k checkpoint right after
saving the new one, then deletes ``last.ckpt`` and links it again: a process killed in
between leaves ``last.ckpt`` pointing at a deleted file (or missing). Here the new link is
made under a temporary name in the same directory and renamed onto ``last.ckpt``
(``os.replace``, atomic on POSIX), and a checkpoint is deleted only once the link points
at its successor. Checkpoints may be files or directories (FSDP2 sharded checkpoints).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override


def replace_link(target: str, linkpath: str) -> None:
    """Point ``linkpath`` at ``target`` atomically: at every moment ``linkpath`` names
    either the old checkpoint or ``target``. The link is relative (the directory can move);
    where symbolic links are refused (Windows), a copy is renamed into place instead."""
    directory = os.path.dirname(os.path.abspath(linkpath))
    temporary = os.path.join(directory, f".{os.path.basename(linkpath)}.{os.getpid()}.tmp")
    _remove_path(temporary)  # left over by a process killed here before
    try:
        os.symlink(os.path.relpath(os.path.abspath(target), directory), temporary)
    except OSError:
        if os.path.isdir(target):
            shutil.copytree(target, temporary)
        else:
            shutil.copy(target, temporary)
    if os.path.isdir(linkpath) and not os.path.islink(linkpath):
        # A real directory (a copied sharded checkpoint) cannot be replaced by a rename:
        # move it aside first, so the window without last.ckpt is one rename long.
        aside = f"{temporary}.old"
        _remove_path(aside)
        os.replace(linkpath, aside)
        os.replace(temporary, linkpath)
        _remove_path(aside)
    else:
        os.replace(temporary, linkpath)


def _remove_path(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


class AtomicLinkModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` link is replaced atomically, and whose
    outdated checkpoints are deleted only after ``last.ckpt`` points at a newer one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending_removals: list[str] = []

    @override
    def _link_checkpoint(self, trainer: pl.Trainer, filepath: str, linkpath: str) -> None:  # type: ignore[override]
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            replace_link(filepath, linkpath)
        trainer.strategy.barrier()
        # last.ckpt now names filepath: the checkpoints it replaced may go.
        pending, self._pending_removals = self._pending_removals, []
        for path in pending:
            if os.path.abspath(path) != os.path.abspath(filepath):
                super()._remove_checkpoint(trainer, path)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self.save_last == "link" and self.save_top_k != 0:
            # last.ckpt may still point at it: deleted after the next link update.
            self._pending_removals.append(filepath)
        else:
            super()._remove_checkpoint(trainer, filepath)
