"""Chat sources, each mapped onto ChatML roles as :class:`~odb_lightning.data.ChatRecord`.

``synthetic`` is not here: it yields token samples directly
(:class:`~odb_lightning.data.synthetic.SyntheticDataset`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from odb_lightning.data.sources.chitchat import chitchat_records
from odb_lightning.data.sources.jsonl import OnBadRecord, jsonl_records
from odb_lightning.data.sources.sharegpt import ShareGPTRegime, recover_json_array, sharegpt_records
from odb_lightning.data.sources.source_records import SourceRecords
from odb_lightning.data.sources.ultrachat import ULTRACHAT_HUB_NAME, ultrachat_records


class SourceName(StrEnum):
    """Conversation sources :func:`load_source` knows."""

    SHAREGPT = "sharegpt"
    CHITCHAT = "chitchat"
    ULTRACHAT = "ultrachat"
    JSONL = "jsonl"


def load_source(
    name: SourceName | str,
    *,
    path: str | Path | None = None,
    regime: ShareGPTRegime | str = ShareGPTRegime.WHOLE,
    max_samples: int | None = None,
    seed: int = 0,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
) -> SourceRecords:
    """Load a conversation source by name.

    Args:
        path: Required by ``ultrachat`` (parquet file/dir or hub name) and ``jsonl``.
        regime: ShareGPT only.
        max_samples: Cap on the number of records.
        seed: ShareGPT ``mix`` seed.
        on_bad_record: ``jsonl`` only (see :func:`jsonl_records`). The bundled sources
            drop what they cannot use and count it; UltraChat rows are converted when
            read, so their problems are bad samples in the loader.

    Returns:
        The records and the counts of what was read, kept and dropped.
    """
    name = SourceName(name)
    if name is SourceName.SHAREGPT:
        return sharegpt_records(regime=regime, max_samples=max_samples, seed=seed)
    if name is SourceName.CHITCHAT:
        return chitchat_records(max_samples=max_samples)
    if name is SourceName.ULTRACHAT:
        return ultrachat_records(path, max_samples=max_samples)
    if path is None:
        raise ValueError("the jsonl source needs data.path: a JSON Lines file")
    return jsonl_records(path, max_samples=max_samples, on_bad_record=on_bad_record)


__all__ = [
    "ULTRACHAT_HUB_NAME",
    "OnBadRecord",
    "ShareGPTRegime",
    "SourceName",
    "SourceRecords",
    "chitchat_records",
    "jsonl_records",
    "load_source",
    "recover_json_array",
    "sharegpt_records",
    "ultrachat_records",
]
