"""Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` link that never dangles.

Lightning 2.6 (``save_last="link"``) deletes the previous top-k checkpoint right after
saving the new one, then deletes ``last.ckpt`` and links it again: a process killed in
between leaves ``last.ckpt`` pointing at a deleted file (or missing). Here the new link is
made under a temporary name in the same directory and renamed onto ``last.ckpt``
(``os.replace``, atomic on POSIX), and a checkpoint is deleted only once the link points
at its successor. Checkpoints may be files or directories (FSDP2 sharded checkpoints).

Checkpoint names hold no ``=`` (``epoch0-step10.ckpt``, ``stop-epoch0-step10.ckpt``, not
Lightning's default ``epoch=0-step=10.ckpt``): Hydra's override parser refuses a second
``=`` in ``ckpt_path=...``, so a name is passed back on the command line as it is printed.
Older names still resume (a checkpoint is found by its ``.ckpt`` suffix, never by name);
:func:`ckpt_path_override` quotes one for the command line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from odb_lightning.lit.callbacks.run_report import NoSupervisedTokensError

CHECKPOINT_FILENAME = "epoch{epoch}-step{step}"
"""Lightning ``ModelCheckpoint`` ``filename`` pattern (with ``auto_insert_metric_name``
off): ``epoch0-step10.ckpt``."""


def stop_checkpoint_name(epoch: int, step: int) -> str:
    """The file name of the checkpoint a stop signal saves: ``stop-epoch0-step10.ckpt``."""
    return f"stop-epoch{epoch}-step{step}.ckpt"


LAST_LINK = "last.ckpt"
"""The link to the newest checkpoint, re-pointed only after a save has completed."""


class SavedCheckpoint(NamedTuple):
    """A complete checkpoint on disk and the optimizer step its name gives."""

    path: Path
    step: int


def linked_checkpoint(directory: Path) -> SavedCheckpoint | None:
    """The checkpoint ``directory/last.ckpt`` names, when it is complete on disk (a zip
    archive with its end, or a sharded directory with torch's ``.metadata``) and named
    with its step (``...step<S>.ckpt``); else ``None``. A save that a kill cut short is
    never named: the link moves to a checkpoint only after its save returned."""
    link = directory / LAST_LINK
    target = link.resolve()
    complete = (
        (target / ".metadata").is_file() if target.is_dir() else zipfile.is_zipfile(target)
    ) if target.exists() else False  # fmt: skip
    found = re.search(r"step(\d+)(?:-v\d+)?\.ckpt$", target.name)
    if not complete or found is None:
        return None
    return SavedCheckpoint(target, int(found.group(1)))


def ckpt_path_override(path: str | os.PathLike[str]) -> str:
    """``ckpt_path=<path>`` as a shell word that Hydra's override parser reads back as
    ``path``: bare where Hydra takes the path as it is (every name this package writes, in
    a directory without spaces or Hydra's special characters), else quoted (the older
    ``epoch=0-step=10.ckpt`` names)."""
    return shlex.quote(hydra_override("ckpt_path", os.fspath(path)))


def hydra_override(key: str, text: str) -> str:
    """``key=text`` as Hydra's override parser reads back ``text``: bare where Hydra takes
    it as it is (a path without spaces or Hydra's special characters), else quoted."""
    bare = all(c.isalnum() or c in "/._-+~@%" for c in text)
    return f"{key}={text}" if bare else f"{key}={_hydra_quoted(text)}"


def _hydra_quoted(text: str) -> str:
    # Hydra's quoted values: backslashes escape only quotes (and backslashes before them).
    quote = "'" if '"' in text and "'" not in text else '"'
    return quote + text.replace(quote, "\\" + quote) + quote


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


class UntrainedCheckpointError(NoSupervisedTokensError):
    """A checkpoint would be saved after 0 optimizer steps: of a model nothing trained."""


class AtomicLinkModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` link is replaced atomically, and whose
    outdated checkpoints are deleted only after ``last.ckpt`` points at a newer one.

    Its checkpoints are named without ``=`` (:data:`CHECKPOINT_FILENAME`) unless
    ``filename`` says otherwise.

    Args:
        keep_last: Keep the newest this many checkpoints (``callbacks.checkpoint.keep_last``,
            as Hugging Face's ``save_total_limit``; -1: every one): Lightning's own top-k
            over the optimizer step, ``save_top_k=keep_last`` with ``monitor="step"``,
            ``mode="max"``. ``None``: Lightning's ``save_top_k`` and ``monitor`` as given.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = CHECKPOINT_FILENAME,
        *,
        keep_last: int | None = None,
        auto_insert_metric_name: bool = False,
        **kwargs: Any,
    ) -> None:
        if keep_last is not None:
            integer = isinstance(keep_last, int) and not isinstance(keep_last, bool)
            if not integer or not (keep_last >= 1 or keep_last == -1):
                raise ValueError(
                    f"callbacks.checkpoint.keep_last must be an integer >= 1 (the newest "
                    f"checkpoints kept) or -1 (every one), got {keep_last!r}"
                )
            if "save_top_k" in kwargs or "monitor" in kwargs:
                raise ValueError(
                    "callbacks.checkpoint.keep_last keeps the newest checkpoints: set it, or "
                    "save_top_k with a monitor, not both"
                )
            kwargs.update(save_top_k=keep_last, monitor=None if keep_last == 1 else "step")
            kwargs.setdefault("mode", "max")
        super().__init__(
            dirpath, filename, auto_insert_metric_name=auto_insert_metric_name, **kwargs
        )
        self._pending_removals: list[str] = []

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:  # type: ignore[override]
        # global_step is the same on every rank: all of them refuse here, or none.
        if trainer.global_step == 0 and trainer.max_steps != 0:
            raise UntrainedCheckpointError(
                f"epoch {trainer.current_epoch} ended after 0 optimizer steps: nothing was "
                f"trained, so no checkpoint is written ({filepath}). The training loader "
                "gave no batch: check data.source.path, data.sizes.max_samples and "
                "data.sizes.val_samples (the source counts are in train.log) and "
                "trainer.limit_train_batches"
            )
        super()._save_checkpoint(trainer, filepath)

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
