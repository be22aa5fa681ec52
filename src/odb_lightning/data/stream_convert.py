"""The user's files written once as a stream of LitData chunks
(:mod:`odb_lightning.data.stream`), and the proof that a stream is what was written.

* **Conversion** (:func:`convert_jsonl_stream`): once per path, under a fingerprint of its
  files (resolved path, size, modification time, inode and change time of each), the
  bad-line policy, the record
  layout and the format version, by one process while the others wait for it (a file
  lock, bounded). The files, layouts, bad-line policy and messages (file, line or row,
  field) are those of the ``jsonl`` source: JSON Lines, a JSON array, parquet, a folder or
  glob of them, a ``save_to_disk`` folder, in any layout of
  :mod:`odb_lightning.data.formats`. It runs in a
  spawned child that is the only writer: LitData's writer takes the job's ranks from
  ``torch.distributed`` and ``WORLD_SIZE`` and would wait for every rank's part.
* **Content** (:func:`stream_problem`): the conversion writes the page digests of every
  file it wrote (LitData's chunks and ``index.json``,
  :data:`~odb_lightning.data.stream.CONTENT_FILE`,
  :mod:`odb_lightning.data.content_digest`); every process that opens the stream checks
  them first, so a missing, cut or damaged chunk is logged naming the file and the page
  and converted again, and a stream directory that is a symbolic link, or holds one, is
  refused naming it. A record that cannot be decoded all the same (damage in a page no
  check drew) fails naming its index, its chunk and what to delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from filelock import FileLock, Timeout

from odb_lightning.data.content_digest import content_digest, content_problem
from odb_lightning.data.conversation import BadRecordError
from odb_lightning.data.formats import AUTO, FieldMapping
from odb_lightning.data.sources.files import data_files, iter_rows
from odb_lightning.data.sources.jsonl import OnBadRecord, RecordParser
from odb_lightning.data.sources.source_records import source_version
from odb_lightning.data.stream import (
    CHUNK_BYTES,
    CONTENT_FILE,
    COUNTS_FILE,
    LAYOUT_FILE,
    STREAM_FORMAT,
    StreamError,
    require_litdata,
)

log = logging.getLogger(__name__)


def stream_fingerprint(
    path: str | Path,
    on_bad_record: str,
    layout: str = AUTO,
    mapping: FieldMapping | None = None,
) -> str:
    """What decides the converted records: the files of ``path`` (resolved path, size,
    modification time, inode and change time of each), the bad-line policy, the layout
    (``layout`` or ``mapping``) and :data:`STREAM_FORMAT`.

    Raises:
        DataPathError: ``path`` names nothing readable (the message says what it found).
    """
    versions = [source_version("jsonl", str(file)) for file in data_files(path)]
    key = [versions, OnBadRecord(on_bad_record).value, layout, STREAM_FORMAT]
    if mapping is not None:
        key.append(mapping.as_json())
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]


def write_chat_stream(
    path: str | Path,
    out_dir: str | Path,
    on_bad_record: str,
    chunk_bytes: str = CHUNK_BYTES,
    layout: str = AUTO,
    mapping: FieldMapping | None = None,
) -> dict:
    """Write the records of the files at ``path`` as LitData chunks in ``out_dir`` (run
    it where no ``torch.distributed`` group exists, see the module docstring).

    Rows are read as the ``jsonl`` source reads them: in ``layout`` (``auto``: the one the
    first record shows) or the user's ``mapping``, blank lines skipped, a bad record
    raised or, with ``on_bad_record="skip"``, counted under ``dropped/bad_record``.

    Returns:
        The counts (``read``, ``kept``, ``duplicate_ids``, ``dropped/bad_record``), also
        written to :data:`COUNTS_FILE` in ``out_dir``; the layout read goes to
        :data:`LAYOUT_FILE`.
    """
    Cache = require_litdata().streaming.Cache

    skip = OnBadRecord(on_bad_record) is OnBadRecord.SKIP
    counts: Counter[str] = Counter()
    seen_ids: set[str | int] = set()
    files = data_files(path)
    parse = RecordParser(layout, len(files) > 1, mapping)
    cache = Cache(str(out_dir), chunk_bytes=chunk_bytes)
    for where, number, payload in iter_rows(files):
        counts["read"] += 1
        try:
            record = parse(payload, where, number)
        except BadRecordError:
            if not skip:
                raise
            counts["dropped/bad_record"] += 1
            continue
        counts["duplicate_ids"] += record["id"] in seen_ids
        seen_ids.add(record["id"])
        index = counts["kept"]
        messages = json.dumps(record["messages"], ensure_ascii=False)
        cache[index] = {"index": index, "id": str(record["id"]), "messages": messages}
        counts["kept"] += 1
    if counts["kept"]:
        cache.done()
        cache.merge()
    digests = {f.name: content_digest(f) for f in sorted(Path(out_dir).iterdir()) if f.is_file()}
    Path(out_dir, CONTENT_FILE).write_text(json.dumps(digests))
    written = dict(counts)
    Path(out_dir, COUNTS_FILE).write_text(json.dumps(written))
    layout_read = parse.format.name if parse.format is not None else layout
    Path(out_dir, LAYOUT_FILE).write_text(json.dumps({"layout": layout_read}))
    return written


def _write_alone(
    path: str, out_dir: str, on_bad_record: str, layout: str, mapping: FieldMapping | None
) -> dict:
    """:func:`write_chat_stream` as the only writer: LitData reads the job's size from
    ``WORLD_SIZE`` (set by launchers) and would wait for the other ranks' chunks."""
    os.environ.update(WORLD_SIZE="1", GLOBAL_RANK="0", NNODES="1")
    return write_chat_stream(path, out_dir, on_bad_record, layout=layout, mapping=mapping)


def convert_jsonl_stream(
    path: str | Path,
    cache_dir: str | Path,
    on_bad_record: str,
    timeout_s: float = 3600.0,
    layout: str = AUTO,
    mapping: FieldMapping | None = None,
) -> Path:
    """The chunk directory of ``path``'s records, written on first use (see the module
    docstring); every process of a node may call it at once.

    Raises:
        BadRecordError: A bad line under ``on_bad_record="raise"`` (file, line, field).
        TimeoutError: Another process held the conversion longer than ``timeout_s``.
    """
    target = Path(cache_dir) / stream_fingerprint(path, on_bad_record, layout, mapping)
    if _whole(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target) + ".lock")
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise TimeoutError(
            f"waited {timeout_s:.0f}s for another process to convert {path} into the stream "
            f"at {target} (lock {lock.lock_file}); if no process is converting, delete the lock"
        ) from None
    try:
        if not _whole(target):
            if target.exists():  # damaged (logged): replaced whole
                shutil.rmtree(target)
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                job = (str(path), str(partial), on_bad_record, layout, mapping)
                pool.submit(_write_alone, *job).result()
            os.replace(partial, target)  # readers see a whole stream or none
    finally:
        lock.release()
    return target


def stream_problem(directory: Path) -> str | None:
    """How the stream at ``directory`` differs from what its conversion wrote (a file
    missing, cut, or a page that differs, :data:`CONTENT_FILE`); ``None`` when it does
    not."""
    try:
        digests = json.loads(Path(directory, CONTENT_FILE).read_text())
        return content_problem({Path(directory, name): d for name, d in digests.items()})
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{type(error).__name__}: {error}"


def check_not_linked(directory: Path) -> None:
    """Refuse a stream directory that is, or holds, a symbolic link (the conversion
    writes none).

    Raises:
        StreamError: Naming the link and the fix.
    """
    links = [directory] if directory.is_symlink() else []
    if not links and directory.is_dir():
        links = [path for path in directory.iterdir() if path.is_symlink()]
    if links:
        raise StreamError(
            f"the stream {directory} is not the cache's own: {links[0]} is a symbolic link "
            f"(to {os.readlink(links[0])}), and the conversion writes real files only. "
            f"Remove it (rm -r {directory}) and the next run converts the source again"
        )


def _whole(target: Path) -> bool:
    """Whether ``target`` holds a whole stream as written; a damaged one is logged."""
    check_not_linked(target)
    if not (target / COUNTS_FILE).is_file():
        return False
    problem = stream_problem(target)
    if problem is not None:
        log.warning("the stream %s is damaged (%s); converting again", target, problem)
    return problem is None
