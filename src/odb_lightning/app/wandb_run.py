"""One W&B run per run directory: a resume logs into the run it continues.

A ``WandbLogger`` without an ``id`` starts a new W&B run each time, so a resumed job (the
same run directory, ``ckpt_path=...`` or ``ckpt_path=auto``) used to show as a second run.
The first job of a run directory draws the id and writes it there (``wandb_run_id``, rank
0); a resume reads it back and passes it with ``resume="allow"``. Offline, each attempt
writes its own ``offline-run-<time>-<id>`` directory with the one id, and ``wandb sync``
uploads them into one run.
"""

from __future__ import annotations

import logging
import secrets
import string
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from odb_lightning.lit.run_files import write_run_file

log = logging.getLogger(__name__)

WANDB_ID_FILE = "wandb_run_id"
WANDB_LOGGER_TARGETS = (
    "lightning.pytorch.loggers.WandbLogger",
    "lightning.pytorch.loggers.wandb.WandbLogger",
)


def run_id(output_dir: Path, resuming: bool) -> str:
    """The W&B run id of ``output_dir``: the stored one on a resume, else a new one
    (stored by rank 0)."""
    path = output_dir / WANDB_ID_FILE
    if resuming and path.is_file():
        stored = path.read_text(encoding="utf-8").strip()
        if stored:
            return stored
    # W&B's own ids are 8 characters of a-z and 0-9 (its generator is not public API).
    new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if rank_zero_only.rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_run_file(path, new + "\n")
    return new


def wandb_run_ids(
    loggers: DictConfig | None, output_dir: Path, resuming: bool
) -> dict[str, dict[str, str]]:
    """Per ``WandbLogger`` entry of ``loggers`` that sets no ``id`` of its own, the
    arguments that give it the run directory's W&B run: ``id`` and ``resume="allow"``."""
    if not loggers:
        return {}
    entries = [
        name
        for name, entry in loggers.items()
        if isinstance(entry, DictConfig)
        and entry.get("_target_") in WANDB_LOGGER_TARGETS
        and entry.get("id") is None
    ]
    if not entries:
        return {}
    identifier = run_id(output_dir, resuming)
    if resuming:
        log.info("W&B: resuming run %s (%s)", identifier, output_dir / WANDB_ID_FILE)
    return {name: {"id": identifier, "resume": "allow"} for name in entries}
