"""The settings a streamed data module (``data.streaming=true``) refuses, each with the
reason and the fix: a stream is read in order, each rank its own part, and never whole."""

from __future__ import annotations

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.stream import require_litdata


def check_streaming(
    source: str,
    batching: BatchingConfig,
    max_samples: int | float | None,
    val_samples: int | float | None,
    stream_cache_dir: str | None,
) -> None:
    """Raise ``ValueError`` naming the key and the fix for a setting a stream cannot serve."""
    if source != "jsonl":
        raise ValueError(
            f"data.streaming=true streams a JSON Lines file (data=jsonl), got "
            f"data.source={source!r}: write the records as JSON Lines, or set data.streaming=false"
        )
    policy = batching.policy
    if not policy.online:
        raise ValueError(
            f"data.streaming=true: batching={batching.mode} plans each epoch from the lengths "
            "of the whole set, which a stream never holds; use batching=odb or odb_packed "
            "(or data.streaming=false for a planned mode)"
        )
    if policy.by_need:
        raise ValueError(
            "data.streaming=true reads each rank's own part of the stream, in order; "
            "batching.policy.shard_dealing=by_need deals one global order (random access): "
            "set batching.policy.shard_dealing=fixed"
        )
    if val_samples:
        raise ValueError(
            f"data.streaming=true: data.val_samples={val_samples} holds out a seeded choice "
            "of records, which needs random access; set data.val_samples=0 (validate on "
            "another file with data.streaming=false)"
        )
    if max_samples is not None:
        raise ValueError(
            f"data.streaming=true reads the whole file; data.max_samples={max_samples} must "
            "be null (cut the file instead)"
        )
    if stream_cache_dir is None:
        raise ValueError("data.streaming=true needs data.stream_cache_dir (where chunks go)")
    require_litdata()  # the engine: missing, the error says how to install it
