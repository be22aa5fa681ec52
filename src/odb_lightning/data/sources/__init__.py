"""The data sources, each mapped onto ChatML roles as :class:`~odb_lightning.data.ChatRecord`
(or, for ``synthetic``, token samples drawn from a length profile).

Which sources exist, what each needs and how it is read is one table,
:data:`~odb_lightning.data.sources.table.SOURCES`. Each reader lives in its own module
here (``sharegpt.py``, ``jsonl.py``, ...), named by its table line and imported when the
source is read, so that importing the table stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from odb_lightning.data.sources.table import (
    SOURCES,
    Source,
    SourceKind,
    SourceRequest,
    resolve,
    source_named,
    source_names,
)

if TYPE_CHECKING:
    from odb_lightning.data.record_table import RecordCache
    from odb_lightning.data.sources.source_records import SourceReader, SourceRecords


def _request(
    name: str,
    *,
    path: str | Path | None = None,
    regime: object = "whole",
    max_samples: int | None = None,
    seed: int = 0,
    on_bad_record: object = "raise",
    set_dir: str | None = None,
    format: str = "auto",
    mapping: dict[str, Any] | None = None,
) -> tuple[Source, SourceRequest]:
    """The table's entry of ``name`` and what it is asked for (a source that needs a path
    refused without one; the arguments as :func:`load_source` takes them)."""
    source = source_named(name)
    if source.needs_path and path is None:
        raise ValueError(f"data.source.name={source.name} needs data.source.path")
    request = SourceRequest(
        None if path is None else str(path), str(getattr(regime, "value", regime)),
        max_samples, seed, str(getattr(on_bad_record, "value", on_bad_record)), set_dir,
        format, mapping,
    )  # fmt: skip
    return source, request


def source_reader(name: str, **arguments: Any) -> SourceReader:
    """The reader of a source whose records a record table converts (every source in
    :data:`SOURCES` with a ``reader``; the arguments as :func:`load_source` takes them)."""
    source, request = _request(name, **arguments)
    if source.reader is None:
        raise ValueError(f"data.source.name={source.name} has no records to convert")
    return resolve(source.reader)(request)


def load_source(
    name: str, *, record_cache: RecordCache | None = None, **arguments: Any
) -> SourceRecords:
    """Load a source's records by name (:data:`SOURCES`).

    Args:
        record_cache: Where the records are converted once into a memory-mapped table
            and read from (:class:`~odb_lightning.data.record_table.RecordCache`);
            ``None`` reads them into memory. UltraChat is a parquet table already.
        **arguments: What the source is asked for
            (:class:`~odb_lightning.data.sources.table.SourceRequest`'s fields): ``path``
            (required by the sources that need one), ``regime`` (ShareGPT),
            ``max_samples``, ``seed``, ``on_bad_record`` (the user's files: ``raise``, or
            ``skip`` and count; the bundled sources drop what they cannot use and count
            it), ``set_dir`` (where ``llava`` and ``sharegpt4o`` are written), ``format``
            and ``mapping`` (the layout of the user's files).

    Returns:
        The records and the counts of what was read, kept and dropped.
    """
    source, request = _request(name, **arguments)
    return source.records(request, record_cache)


__all__ = [
    "SOURCES",
    "Source",
    "SourceKind",
    "SourceRequest",
    "load_source",
    "source_named",
    "source_names",
    "source_reader",
]
