"""Chat sources, each mapped onto ChatML roles as :class:`~odb_lightning.data.ChatRecord`.

``synthetic`` is not here: it yields token samples directly
(:class:`~odb_lightning.data.synthetic.SyntheticDataset`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from odb_lightning.data.sources.chitchat import chitchat_records, chitchat_source
from odb_lightning.data.sources.jsonl import OnBadRecord, jsonl_records, jsonl_source
from odb_lightning.data.sources.sharegpt import (
    ShareGPTRegime,
    recover_json_array,
    sharegpt_records,
    sharegpt_source,
)
from odb_lightning.data.sources.source_records import SourceReader, SourceRecords
from odb_lightning.data.sources.ultrachat import ULTRACHAT_HUB_NAME, ultrachat_records

if TYPE_CHECKING:
    from odb_lightning.data.record_table import RecordCache


class SourceName(StrEnum):
    """Conversation sources :func:`load_source` knows."""

    SHAREGPT = "sharegpt"
    CHITCHAT = "chitchat"
    ULTRACHAT = "ultrachat"
    JSONL = "jsonl"


def source_reader(
    name: SourceName | str,
    *,
    path: str | Path | None = None,
    regime: ShareGPTRegime | str = ShareGPTRegime.WHOLE,
    max_samples: int | None = None,
    seed: int = 0,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
) -> SourceReader:
    """The reader of a source that is not a table already (every one but ``ultrachat``;
    the arguments as :func:`load_source` takes them)."""
    name = SourceName(name)
    if name is SourceName.SHAREGPT:
        return sharegpt_source(regime=regime, max_samples=max_samples, seed=seed)
    if name is SourceName.CHITCHAT:
        return chitchat_source(max_samples=max_samples)
    if name is SourceName.ULTRACHAT:
        raise ValueError("ultrachat is read as the parquet table it is (ultrachat_records)")
    if path is None:
        raise ValueError("the jsonl source needs data.path: a JSON Lines file")
    return jsonl_source(path, max_samples=max_samples, on_bad_record=on_bad_record)


def load_source(
    name: SourceName | str,
    *,
    path: str | Path | None = None,
    regime: ShareGPTRegime | str = ShareGPTRegime.WHOLE,
    max_samples: int | None = None,
    seed: int = 0,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
    record_cache: RecordCache | None = None,
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
        record_cache: Where the records are converted once into a memory-mapped table
            and read from (:class:`~odb_lightning.data.record_table.RecordCache`);
            ``None`` reads them into memory. UltraChat is a parquet table already.

    Returns:
        The records and the counts of what was read, kept and dropped.
    """
    if SourceName(name) is SourceName.ULTRACHAT:
        return ultrachat_records(path, max_samples=max_samples)
    reader = source_reader(
        name,
        path=path,
        regime=regime,
        max_samples=max_samples,
        seed=seed,
        on_bad_record=on_bad_record,
    )
    return reader.collect() if record_cache is None else record_cache.records(reader)


__all__ = [
    "ULTRACHAT_HUB_NAME",
    "OnBadRecord",
    "ShareGPTRegime",
    "SourceName",
    "SourceReader",
    "SourceRecords",
    "chitchat_records",
    "jsonl_records",
    "load_source",
    "recover_json_array",
    "sharegpt_records",
    "source_reader",
    "ultrachat_records",
]
