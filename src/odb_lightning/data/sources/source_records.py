"""What a source hands back: its records plus counts of what it dropped and why."""

from __future__ import annotations

import glob
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any

from odb_lightning.data.conversation import ChatRecord
from odb_lightning.data.sources.table import SOURCES

# Files of a source directory that hold data (a cache or log kept beside them does not).
_DATA_SUFFIXES = frozenset({".parquet", ".arrow", ".jsonl", ".json", ".csv"})


def checked_max_samples(max_samples: int | None) -> int | None:
    """``max_samples`` if it is ``None`` or a non-negative int; raise otherwise."""
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 0):
        raise ValueError(f"max_samples must be >= 0 or None, got {max_samples!r}")
    return max_samples


def take(records: Iterable[ChatRecord], max_samples: int | None) -> Iterator[ChatRecord]:
    """The first ``max_samples`` records (all when ``None``)."""
    return islice(records, checked_max_samples(max_samples))


@dataclass
class SourceRecords:
    """Records of one source plus what was dropped on the way, and why.

    Attributes:
        name: Source name (``"sharegpt"``, ``"jsonl"``, ...).
        records: The conversations, a random-access sequence.
        counts: ``"read"`` (raw records seen), ``"kept"``, and one ``"dropped/<reason>"``
            entry per reason, so nothing is lost silently.
        rejected: Why each record dropped as bad was rejected (location, field, problem).
        warnings: What the reader warned about (logged once when read; a record table
            keeps them and logs them again on every load).
        detected: The layout the reader found its records in
            (:data:`~odb_lightning.data.formats.FORMATS`; empty where the source has one).
    """

    name: str
    records: Sequence[ChatRecord]
    counts: Counter[str] = field(default_factory=Counter)
    rejected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    detected: str = ""

    def __len__(self) -> int:
        return len(self.records)


RecordReader = Callable[[SourceRecords], Iterator[Any]]
"""A source's reader: yields its records one at a time, in order, and counts what it read
and dropped (and the messages of what it rejected or warned about) into the
:class:`SourceRecords` it is given, whose ``records`` it leaves alone. Consumed whole by
:func:`collect` (records in memory) or by a record table's conversion (records on disk)."""


def collect(name: str, reader: RecordReader) -> SourceRecords:
    """``reader``'s records in a list, with its counts (``kept``: the records yielded)."""
    result = SourceRecords(name, [])
    result.records = list(reader(result))
    result.counts["kept"] = len(result.records)
    return result


def _path_version(path: Path) -> str:
    """``path:size:mtime_ns:inode:ctime_ns`` for a file (an edit that restores the
    modification time, as ``cp -p``, ``rsync -t`` or ``tar x`` do, still changes the
    inode's change time, which no user call sets); for a directory a digest of that over
    its data files (``_DATA_SUFFIXES``, hidden ones and length caches excluded)."""
    if path.is_file():
        stat = path.stat()
        return f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}:{stat.st_ctime_ns}"
    entries = [
        _path_version(file)
        for file in sorted(path.rglob("*"))
        if file.suffix in _DATA_SUFFIXES
        and not file.name.startswith((".", "lengths-"))
        and file.is_file()
    ]
    digest = hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16]
    return f"{path}/:{len(entries)} files:{digest}"


def source_version(name: str, path: str | Path | None = None) -> str:
    """What identifies a source's content without reading it.

    Returns:
        ``"<package>==<version>"`` for data a package ships (the source table's
        ``package``, read without a path); ``"<path>:<size>:<mtime_ns>:<inode>:<ctime_ns>"``
        for a local file (a digest over all files for a directory or a glob's matches);
        the hub name otherwise.
    """
    package = SOURCES[name].package if name in SOURCES else None
    if path is None and package is not None:
        return f"{package}=={metadata.version(package)}"
    if path is None:
        return name
    text = str(path)
    if any(c in text for c in "*?["):  # a glob: its matches, each by its own version
        matches = sorted(glob.glob(text, recursive=True))
        entries = [_path_version(Path(m).resolve()) for m in matches if Path(m).is_file()]
        digest = hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16]
        return f"{text}:{len(entries)} files:{digest}"
    local = Path(path).expanduser()
    return _path_version(local.resolve()) if local.exists() else text


@dataclass(frozen=True)
class SourceReader:
    """A source's reader with what keys its records: read into memory by :meth:`collect`,
    or converted once into a record table (:mod:`odb_lightning.data.record_table`).

    Attributes:
        name: Source name (``"jsonl"``, ``"llava"``, ...).
        read: The reader.
        version: What identifies the content without reading it (:func:`source_version`).
        arguments: The reader's arguments that change what it yields (JSON values).
        images: Whether its records carry ``images`` (image-text sources).
    """

    name: str
    read: RecordReader
    version: str
    arguments: dict[str, Any]
    images: bool = False

    def collect(self) -> SourceRecords:
        """Every record in a list, with the counts (:func:`collect`)."""
        return collect(self.name, self.read)
