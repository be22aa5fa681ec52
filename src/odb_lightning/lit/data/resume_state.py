"""The data module's share of a checkpoint: the training epoch, the samples consumed in
it over all ranks, an identity of the data that refuses a resume on other data, and the
batching settings it was taken with (a resume with other ones is warned about, not
refused)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from enum import Enum
from typing import Any

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import HANDSHAKE_FIELDS
from odb_lightning.data.config import DataSizes, DataSource
from odb_lightning.runtime.resume import ResumeStateError

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
"""Version of the dictionary :func:`pack_state` writes."""
IDENTITY_RECORDS = 64
"""At least this many evenly spaced records (all, if fewer) are digested, ids and content,
into the data identity of a checkpoint."""


def data_identity(
    settings: dict[str, Any], records: Sequence[Any], num_records: int | None, train_samples: int
) -> dict[str, Any]:
    """What makes a dataset index name the same record: the source settings, the record
    and training-sample counts and a digest of evenly spaced records (ids and content).
    The file path is left out: moved data still resumes."""
    step = max(1, len(records) // IDENTITY_RECORDS)
    sampled = [records[i] for i in range(0, len(records), step)]
    digest = hashlib.sha256(json.dumps(sampled, sort_keys=True, default=str).encode())
    return {
        **settings,
        "num_records": num_records,
        "train_samples": train_samples,
        "records": digest.hexdigest()[:16],
    }


def data_settings(source: DataSource, sizes: DataSizes, seed: int) -> dict[str, Any]:
    """The data settings that decide which record a dataset index names (the path is left
    out: moved data still resumes)."""
    return {"source": source.name, "regime": source.regime} | {
        "max_samples": sizes.max_samples,
        "seed": seed,
        "val_samples": sizes.val_samples,
    }


def batching_settings(batching: BatchingConfig) -> dict[str, Any]:
    """The batching fields of the ranks' handshake (what a round plans), as plain values
    that ``torch.load(weights_only=True)`` reads back."""
    values = {name: batching.knob(name) for name in HANDSHAKE_FIELDS}
    return {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}


def changed_settings(saved: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """``{field: {"old": saved, "new": current}}`` for every batching field that changed
    (nothing for a checkpoint that predates the record)."""
    if not saved:
        return {}
    return {
        k: {"old": saved.get(k), "new": current[k]}
        for k in current
        if k in saved and saved[k] != current[k]
    }


def pack_state(
    identity: dict[str, Any],
    world_size: int,
    train: dict[str, Any],
    batching: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint entry: format, data identity, ranks, the batching settings
    (:func:`batching_settings`) and the train loader's state."""
    state = {"format": CHECKPOINT_FORMAT, "data": identity, "world_size": world_size}
    if batching is not None:
        state["batching"] = batching
    return state | {"train": train}


def resume_changes(state: dict[str, Any], batching: dict[str, Any]) -> dict[str, Any]:
    """The batching fields that differ between a checkpoint entry and this run, logged as
    one warning line (a resume with another budget or window is allowed: warned, not
    refused)."""
    changed = changed_settings(state.get("batching"), batching)
    if changed:
        what = ", ".join(f"{k}: {v['old']!r} -> {v['new']!r}" for k, v in changed.items())
        log.warning(
            "resuming with other batching settings than the checkpoint was taken with "
            "(%s): the rest of the epoch is planned with the new ones",
            what,
        )
    return changed


def unpack_state(
    state: dict[str, Any], identity: dict[str, Any], world_size: int
) -> dict[str, Any]:
    """The train loader's state from a checkpoint entry taken on the same data.

    Raises:
        ResumeStateError: Another format, or the checkpoint was taken on other data (the
            message names every key that changed).
    """
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ResumeStateError(
            f"data module checkpoint state has format {state.get('format')!r}, "
            f"this version reads {CHECKPOINT_FORMAT}"
        )
    saved = state["data"]
    changed = [k for k in sorted(identity) if saved.get(k) != identity[k]]
    if changed:
        what = ", ".join(f"{k}: {saved.get(k)!r} -> {identity[k]!r}" for k in changed)
        raise ResumeStateError(
            f"the checkpoint was taken on other training data ({what}); resume with the "
            "data of the checkpoint, or start a new run without ckpt_path"
        )
    if state["world_size"] != world_size:
        log.info(
            "checkpoint taken with %d ranks, resuming with %d: the rest of the epoch is "
            "re-sharded over the ranks there are now",
            state["world_size"],
            world_size,
        )
    return state["train"]
