"""Record tables: a source converted once into a memory-mapped Arrow table, cached by a
fingerprint of its input, read from disk on access.

A source's reader (:class:`~odb_lightning.data.sources.source_records.SourceReader`: the
very parser and bad-line policy of the in-memory reading, so a bad line raises the same
:class:`~odb_lightning.data.conversation.BadRecordError`, naming file, line and field)
runs once; its records are written in batches into an Arrow file in ``datasets``' format
and read back with ``datasets.Dataset.from_file``, memory-mapped. Every rank and loader
worker of a machine then shares the table's page-cache pages, a dataset over it pickles
as a file reference, and no record is held as a Python object
(:class:`~odb_lightning.data.sources.arrow_records.TableRecords`).

**The fingerprint** is the SHA-256 of :data:`TABLE_FORMAT`, the source's name, what
identifies its content without reading it (a file's resolved path, size, ``mtime_ns``,
inode and ``ctime_ns``: a copy or edit that restores the modification time, as ``cp -p``,
``rsync -t`` and ``tar x`` do, still changes the inode's change time; a bundled set's
package version) and the reader's arguments that change its
records (``max_samples``, ``on_bad_record``, the ShareGPT regime and mix seed). A changed
file is a new fingerprint, so a new table.

**The content digest** proves the table is the one its conversion wrote: the conversion
records the digest of every page of ``records.arrow`` in ``source.json``, and every open
checks them (:mod:`odb_lightning.data.content_digest`: the whole table up to 64 MiB, else
its ends and pages drawn at random). A table that differs (a flipped byte, a copy cut
short) is logged naming the page and converted again. An entry that is a symbolic link,
or whose files are, is refused (:class:`RecordTableError`, naming it and the fix): the
cache writes real directories only, so a link is something else's. A row that cannot be
decoded all the same (damage in a page no check drew) is a bad sample naming its index
and the table (:mod:`~odb_lightning.data.sources.arrow_records`). What the digest does
not prove is who wrote the entry: a process that can write the cache directory can write
a table and a matching ``source.json``; keep ``data.caches.record_dir`` writable by the
run's user only (the default, under the working directory, is).

**Layout** of the cache directory (``data.caches.record_dir``), one entry per fingerprint::

    <source>-<fingerprint[:16]>/records.arrow  the records
    <source>-<fingerprint[:16]>/source.json    format, fingerprint, what it was made of,
                                               counts, rejected lines, warnings, time
    <source>-<fingerprint[:16]>.lock           held while one process converts it

The counts (``read``, ``kept``, ``duplicate_ids``, ``dropped/<reason>``), the messages of
rejected lines and the reader's warnings (a repeated id) are kept in ``source.json`` and
come back, the warnings logged again, on every load.

**One process converts.** Conversion holds the entry's lock file (``filelock``); a
process that finds the entry missing waits for the lock, at most ``wait_s`` (logging
every :data:`LOCK_POLL_S` seconds), then reads the table the holder wrote. It writes into
a hidden directory beside the entry and renames it into place, so an entry that exists is
whole and a failed conversion (a bad line under ``raise``) leaves nothing behind.
Deleting the cache directory, or one entry, is always safe between runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from odb_lightning.data.content_digest import content_digest, content_problem, open_nofollow
from odb_lightning.data.sources.arrow_records import TableRecords, record_schema, table_row
from odb_lightning.data.sources.source_records import SourceReader, SourceRecords

logger = logging.getLogger(__name__)

TABLE_FORMAT = "odb-record-table/2"
"""Version of the table schema and its ``source.json``: a new one converts every source
again."""
RECORDS_FILE = "records.arrow"
SOURCE_FILE = "source.json"
WRITE_BATCH_RECORDS = 1024
"""Records converted to Arrow and written at once (the conversion's memory bound)."""
CONVERSION_WAIT_S = 3600.0
"""How long a process waits for another one's conversion before it gives up."""
LOCK_POLL_S = 30.0
"""How often a waiting process says that it is still waiting."""


class RecordTableError(RuntimeError):
    """A record table that could not be had: a conversion that another process holds too
    long, or an entry that is not the cache's own (a symbolic link)."""


def check_not_linked(entry: Path) -> None:
    """Refuse an entry that is, or holds, a symbolic link (the cache writes none).

    Raises:
        RecordTableError: Naming the link and the fix.
    """
    for path in (entry, entry / RECORDS_FILE, entry / SOURCE_FILE):
        if path.is_symlink():
            raise RecordTableError(
                f"the record table entry {entry} is not the cache's own: {path} is a "
                f"symbolic link (to {os.readlink(path)}), and the cache writes real files "
                f"only. Remove it (rm {'-r ' if path != entry else ''}{entry}) and the "
                "next run converts the source again"
            )


def default_record_cache_dir() -> Path:
    """``odb_lightning/records`` in the ``datasets`` cache (``HF_DATASETS_CACHE``)."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "odb_lightning" / "records"


def table_parts(source: SourceReader) -> dict[str, Any]:
    """What a record table's fingerprint is made of."""
    return {
        "format": TABLE_FORMAT,
        "source": source.name,
        "source_version": source.version,
        "arguments": source.arguments,
    }


def table_fingerprint(parts: dict[str, Any]) -> str:
    """SHA-256 hex digest of the canonical JSON of ``parts``."""
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class RecordCache:
    """A directory of record tables, one per fingerprint (the module docstring).

    Args:
        cache_dir: Where the tables live (created on the first conversion).
        wait_s: How long to wait for a conversion another process holds.
    """

    def __init__(self, cache_dir: str | Path, *, wait_s: float = CONVERSION_WAIT_S) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        self.wait_s = wait_s

    def entry_for(self, source: SourceReader) -> Path:
        """The directory of ``source``'s table."""
        fingerprint = table_fingerprint(table_parts(source))
        return self.cache_dir / f"{source.name}-{fingerprint[:16]}"

    def converted_count(self, source: SourceReader, key: str = "read") -> int | None:
        """The count ``key`` of ``source``'s table if it was converted already (its
        ``source.json``; nothing is read or converted), else ``None``."""
        meta_file = self.entry_for(source) / SOURCE_FILE
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if meta.get("fingerprint") != table_fingerprint(table_parts(source)):
            return None
        count = meta.get("counts", {}).get(key)
        return count if isinstance(count, int) else None

    def records(self, source: SourceReader) -> SourceRecords:
        """``source``'s records, read from its table (converted first if there is none).

        Raises:
            BadRecordError: A bad line under ``on_bad_record=raise`` (no table is left).
            RecordTableError: Another process held the conversion over ``wait_s``.
        """
        parts = table_parts(source)
        fingerprint = table_fingerprint(parts)
        entry = self.entry_for(source)
        loaded = self._load(entry, fingerprint, source.name)
        if loaded is not None:
            return loaded
        with self._locked(entry):
            loaded = self._load(entry, fingerprint, source.name)  # converted while we waited
            if loaded is None:
                loaded = self._convert(source, entry, parts, fingerprint)
        return loaded

    def _load(
        self, entry: Path, fingerprint: str, name: str, *, replay: bool = True
    ) -> SourceRecords | None:
        """The records of a whole entry of ``fingerprint``; ``None`` if there is none (a
        damaged one is logged and converted again). ``replay``: log the reader's warnings
        (a conversion logged them as it read)."""
        check_not_linked(entry)
        if not entry.is_dir():
            return None
        import datasets

        try:
            with open_nofollow(entry / SOURCE_FILE) as file:
                meta = json.loads(file.read().decode("utf-8"))
            if meta.get("format") != TABLE_FORMAT or meta.get("fingerprint") != fingerprint:
                raise ValueError(f"not a {TABLE_FORMAT} entry of fingerprint {fingerprint[:16]}")
            problem = content_problem({entry / RECORDS_FILE: meta["content"]})
            if problem is not None:
                raise ValueError(problem)
            table = datasets.Dataset.from_file(str(entry / RECORDS_FILE))
            if len(table) != meta["num_records"]:
                raise ValueError(f"{len(table)} rows for {meta['num_records']} records")
        except (OSError, ValueError, KeyError, TypeError) as error:  # bad JSON, Arrow, digest
            logger.warning("record table %s is damaged (%s); converting again", entry, error)
            return None
        for warning in meta["warnings"] if replay else ():
            logger.warning("%s", warning)
        logger.info("record table hit: %d %s records, %s", len(table), name, entry)
        return SourceRecords(
            name, TableRecords(table), Counter(meta["counts"]), meta["rejected"],
            meta["warnings"], meta.get("detected", ""),
        )  # fmt: skip

    @contextmanager
    def _locked(self, entry: Path) -> Iterator[None]:
        from filelock import FileLock, Timeout

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        lock_path = entry.with_name(f"{entry.name}.lock")
        lock = FileLock(lock_path)
        start = time.monotonic()
        while True:
            waited = time.monotonic() - start
            try:
                lock.acquire(timeout=max(0.0, min(LOCK_POLL_S, self.wait_s - waited)))
                break
            except Timeout:
                waited = time.monotonic() - start
                if waited >= self.wait_s:
                    raise RecordTableError(
                        f"waited {waited:.0f} s for {lock_path}: another process is "
                        f"converting {entry.name} and has not finished. Wait for it, or, "
                        "if no process is converting (a converter on another machine of a "
                        f"shared file system died), delete {lock_path}"
                    ) from None
                logger.info("waiting for %s (another process converts it): %.0f s", entry, waited)
        try:
            yield
        finally:
            lock.release()

    def _convert(
        self, source: SourceReader, entry: Path, parts: dict[str, Any], fingerprint: str
    ) -> SourceRecords:
        """Run the reader into a new entry (the lock held); the records read from it."""
        for stale in self.cache_dir.glob(f".{entry.name}.*.tmp"):  # a crashed converter's
            shutil.rmtree(stale, ignore_errors=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=self.cache_dir))
        start = time.perf_counter()
        logger.info("converting %s into a record table (once per input): %s", source.name, entry)
        try:
            result = SourceRecords(source.name, [])
            num_records = _write_records(source, result, temp / RECORDS_FILE)
            result.counts["kept"] = num_records
            meta = {
                "format": TABLE_FORMAT,
                "fingerprint": fingerprint,
                "parts": parts,
                "num_records": num_records,
                "counts": dict(result.counts),
                "rejected": result.rejected,
                "warnings": result.warnings,
                "detected": result.detected,
                "content": content_digest(temp / RECORDS_FILE),
                "convert_s": round(time.perf_counter() - start, 3),
            }
            (temp / SOURCE_FILE).write_text(json.dumps(meta, default=str), encoding="utf-8")
            if entry.exists():  # a damaged entry: replaced whole
                shutil.rmtree(entry)
            os.rename(temp, entry)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        logger.info(
            "converted %d %s records in %.2f s", num_records, source.name, meta["convert_s"]
        )
        loaded = self._load(entry, fingerprint, source.name, replay=False)
        if loaded is None:
            raise RecordTableError(f"record table {entry} is unreadable right after conversion")
        return loaded


def _write_records(source: SourceReader, result: SourceRecords, path: Path) -> int:
    """Write every record ``source`` yields to ``path`` in batches; their number."""
    import pyarrow as pa
    from tqdm.auto import tqdm

    schema = record_schema(source.images)
    count, rows = 0, []
    # The number of records is not known before the file is read: the bar counts them and
    # shows the rate (on a terminal; ``disable=None`` keeps logs free of carriage returns).
    bar = tqdm(desc=f"converting {source.name}", unit=" records", mininterval=1.0, disable=None)
    with (
        bar,
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_stream(sink, schema) as writer,
    ):
        for record in source.read(result):
            rows.append(table_row(record, source.images))
            if len(rows) == WRITE_BATCH_RECORDS:
                writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
                count, rows = count + len(rows), []
                bar.update(WRITE_BATCH_RECORDS)
        if rows:
            writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
            count += len(rows)
            bar.update(len(rows))
    return count
