"""UltraChat 200k (``HuggingFaceH4/ultrachat_200k``): parquet rows with a ``messages`` column.

Schema per row: ``prompt`` (str), ``prompt_id`` (str), ``messages``
(list of ``{"content": str, "role": "user" | "assistant"}``). Loaded with ``datasets`` from
a local parquet file or directory; a hub name works where the hub is reachable. Rows are
converted to records on access, so the 200k conversations stay memory-mapped in Arrow and
the sequence pickles as a file reference for spawned workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from odb_lightning.data.conversation import ChatRecord, normalize_role
from odb_lightning.data.sources.arrow_records import ArrowRecords
from odb_lightning.data.sources.hub import hub_unreachable
from odb_lightning.data.sources.source_records import SourceRecords, checked_max_samples
from odb_lightning.data.sources.table import SourceRequest

if TYPE_CHECKING:
    import datasets

ULTRACHAT_HUB_NAME = "HuggingFaceH4/ultrachat_200k"
ULTRACHAT_SPLIT = "train_sft"


class UltraChatRecords(ArrowRecords):
    """A ``datasets.Dataset`` in the UltraChat schema, seen as a sequence of records."""

    def __init__(self, table: datasets.Dataset, offset: int = 0) -> None:
        missing = {"messages"} - set(table.column_names)
        if missing:
            raise ValueError(f"UltraChat data lacks column(s) {sorted(missing)}: {table}")
        super().__init__(table, offset)

    def record_of(self, row: Mapping[str, Any], index: int) -> ChatRecord:
        record_id = row.get("prompt_id") or index
        # Content goes through as it is: the template rejects a non-string one, naming
        # the record and the field, instead of training on an empty turn.
        messages = [
            {
                "role": normalize_role(m.get("role"), record_id, f"messages[{k}].role"),
                "content": m.get("content"),
            }
            for k, m in enumerate(row["messages"] or [])
        ]
        return ChatRecord(id=record_id, messages=messages)


def _parquet_files(path: Path, split: str) -> list[str]:
    if path.is_file():
        return [str(path)]
    files = sorted(path.rglob("*.parquet"))
    in_split = [f for f in files if f.name.startswith(f"{split}-") or f.stem == split]
    if not (in_split or files):
        raise FileNotFoundError(
            f"data.source.path={str(path)!r}: no .parquet files in this directory"
        )
    return [str(f) for f in in_split or files]


def _load_table(path: str, split: str, cache_dir: str | None) -> datasets.Dataset:
    import datasets

    local = Path(path).expanduser()
    if local.exists():
        files = _parquet_files(local, split)
        return datasets.load_dataset(
            "parquet", data_files=files, split="train", cache_dir=cache_dir
        )
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise FileNotFoundError(f"data.source.path={path!r} does not exist (UltraChat parquet)")
    if reason := hub_unreachable():
        raise OSError(
            f"data.source.path={path!r} is a hub name, and {reason}: download the parquet "
            "files where the hub is reachable and set data.source.path to their file or "
            "directory"
        )
    try:
        return datasets.load_dataset(path, split=split, cache_dir=cache_dir)
    except (ConnectionError, OSError) as error:
        raise OSError(
            f"data.source.path={path!r}: could not load UltraChat from the Hugging Face hub "
            "(offline?). Download the parquet files and set data.source.path to the local file "
            "or directory."
        ) from error


def ultrachat_records(
    path: str | Path | None,
    *,
    split: str = ULTRACHAT_SPLIT,
    max_samples: int | None = None,
    cache_dir: str | Path | None = None,
) -> SourceRecords:
    """UltraChat conversations.

    Args:
        path: A parquet file, a directory of parquet files (those named ``{split}-*`` are
            preferred, as in the hub layout), or a hub name such as
            ``"HuggingFaceH4/ultrachat_200k"``. ``None`` is an error: there is no offline
            default.
        split: Split to read from a hub name or a hub-layout directory.
        cache_dir: ``datasets`` cache directory (its default when ``None``).

    Returns:
        Lazily converted records (id = ``prompt_id``), counts ``read`` and ``kept``.
    """
    if path is None:
        raise ValueError(
            "UltraChat needs data.source.path: a local parquet file or directory in the "
            f"ultrachat_200k schema, or the hub name {ULTRACHAT_HUB_NAME!r} where the hub "
            "is reachable."
        )
    table = _load_table(str(path), split, None if cache_dir is None else str(cache_dir))
    result = SourceRecords("ultrachat", [])
    result.counts["read"] = len(table)
    if checked_max_samples(max_samples) is not None:
        table = table.select(range(min(max_samples, len(table))))
    result.records = UltraChatRecords(table)
    result.counts["kept"] = len(table)
    return result


def open_table(request: SourceRequest) -> SourceRecords:
    """The source table's opener of ``ultrachat`` (the parquet path, ``max_samples``)."""
    return ultrachat_records(request.path, max_samples=request.max_samples)
