"""The length cache's file format: one Arrow IPC file per fingerprint
(``lengths-<fingerprint[:16]>.arrow``) of two ``int32`` columns, ``length`` and
``num_loss_tokens``, one row per sample in dataset order, whose schema metadata holds a
JSON header (format, fingerprint, parts, count, build time). Read memory-mapped: the
columns are numpy views of the file (:mod:`~odb_lightning.data.length_cache` builds and
keys them; ``odb-plan --lengths`` reads them)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

CACHE_FORMAT = "odb-length-cache/2"
HEADER_KEY = b"odb_length_cache"
"""The schema metadata key of a cache file's JSON header."""
LENGTH_COLUMNS = ("length", "num_loss_tokens")


class CorruptCacheError(ValueError):
    """A cache file that cannot be trusted (unreadable, truncated or inconsistent)."""


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a cache file (its schema only is read).

    Raises:
        CorruptCacheError: Not a readable cache file of this format.
    """
    import pyarrow as pa

    try:
        metadata = pa.ipc.open_file(pa.memory_map(str(path))).schema.metadata or {}
        header = json.loads(metadata[HEADER_KEY])
    except (OSError, ValueError, KeyError, pa.ArrowException) as error:
        raise CorruptCacheError(f"{path}: unreadable ({error})") from error
    if not isinstance(header, dict) or header.get("format") != CACHE_FORMAT:
        raise CorruptCacheError(f"{path}: not a {CACHE_FORMAT} file")
    return header


def read_length_columns(path: Path) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """A cache file's header and its two columns, memory-mapped, checked against the
    header (a sample has at least one token; a damaged file fails here).

    Raises:
        CorruptCacheError: Unreadable, truncated or inconsistent.
    """
    import pyarrow as pa

    header = read_header(path)
    count = header.get("num_samples")
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        columns = [table.column(name).combine_chunks().to_numpy() for name in LENGTH_COLUMNS]
    except (OSError, KeyError, pa.ArrowException) as error:
        raise CorruptCacheError(f"{path}: unreadable ({error})") from error
    for name, values, least in zip(LENGTH_COLUMNS, columns, (1, 0), strict=True):
        ok = values.dtype == np.int32 and len(values) == count
        if not ok or (count and int(values.min()) < least):
            raise CorruptCacheError(f"{path}: {name} is not {count} int32 >= {least}")
    return header, columns[0], columns[1]


def write_length_file(
    directory: Path,
    path: Path,
    header: dict[str, Any],
    lengths: np.ndarray,
    num_loss_tokens: np.ndarray,
) -> None:
    """Write a cache file atomically: a temp file in ``directory``, then ``os.replace``
    (no temp file is left behind).

    Raises:
        OSError: ``directory`` cannot be created or written.
    """
    import pyarrow as pa

    metadata = {HEADER_KEY: json.dumps(header, default=str).encode()}
    table = pa.table(dict(zip(LENGTH_COLUMNS, (lengths, num_loss_tokens), strict=True)))
    table = table.replace_schema_metadata(metadata)
    temp: Path | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=directory, prefix=".lengths-", suffix=".tmp")
        temp = Path(name)
        with os.fdopen(fd, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(temp, path)
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)  # already gone after a successful replace
