"""Chat records as a stream: a JSON Lines file written once as LitData chunks, then read
by each rank in order, its own part of it, never held whole.

The engine is LitData (``litdata.streaming``): ``Cache`` writes the chunks,
``StreamingDataset`` reads them (why LitData and not a ``datasets`` iterable dataset:
``experiments/streaming/README.md``). Each item is one record, ``{"index": k, "id": ...,
"messages": <JSON text>}``, ``k`` its place among the file's kept records: the sample id
the loader, the id audit and resume use.

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
  file it wrote (LitData's chunks and ``index.json``, :data:`CONTENT_FILE`,
  :mod:`odb_lightning.data.content_digest`); every process that opens the stream checks
  them first, so a missing, cut or damaged chunk is logged naming the file and the page
  and converted again, and a stream directory that is a symbolic link, or holds one, is
  refused naming it. A record that cannot be decoded all the same (damage in a page no
  check drew) fails naming its index, its chunk and what to delete.
* **Parts** (:meth:`ChatStream.part`): LitData deals each rank a contiguous run of the
  records (``shuffle=False``, ``drop_last=False``, so parts may differ by a record and
  none is dropped). The reader checks every record's index against its place, so a
  change in LitData's dealing fails loudly instead of reading a record twice.
* **Restart** (:meth:`ChatStream.records`): from any place in the part, through the
  engine's own state (``state_dict(num_samples_yielded=...)``), without reading what is
  before it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from odb_lightning.data.content_digest import content_digest, content_problem
from odb_lightning.data.conversation import BadRecordError, ChatRecord
from odb_lightning.data.dataset import ChatDataset
from odb_lightning.data.formats import AUTO, FieldMapping
from odb_lightning.data.sources.files import data_files, iter_rows
from odb_lightning.data.sources.jsonl import OnBadRecord, RecordParser
from odb_lightning.data.sources.source_records import source_version
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.sample import Sample

log = logging.getLogger(__name__)

STREAM_FORMAT = 2
"""Version of the items :func:`write_chat_stream` writes and of the files beside them
(part of the fingerprint)."""
COUNTS_FILE = "odb_source_counts.json"
"""Beside LitData's ``index.json``: what the conversion read, kept and dropped."""
LAYOUT_FILE = "odb_layout.json"
"""Beside it: the record layout the conversion read (``{"layout": <name>}``)."""
CONTENT_FILE = "odb_content.json"
"""Beside them: the page digests of every file LitData wrote (``{name: digest}``)."""
CHUNK_BYTES = "64MB"
"""LitData chunk size: a rank reads its part chunk by chunk."""


class StreamError(RuntimeError):
    """A stream that cannot be read as written (changed data, or another dealing)."""


def require_litdata() -> Any:
    """The ``litdata`` module, or an error that says how to install it."""
    try:
        import litdata
        import litdata.streaming
    except ImportError as error:
        raise ImportError(
            "data.streaming=true needs LitData: pip install 'odb_lightning[streaming]' "
            "(on a CPU-only machine `make setup` installs it without torchvision)"
        ) from error
    return litdata


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


@dataclass(frozen=True, slots=True)
class StreamPart:
    """A rank's part of the stream: records ``first .. first + count - 1``, in order."""

    first: int
    count: int

    def ids(self) -> range:
        return range(self.first, self.first + self.count)


class ChatStream:
    """The records of a chunk directory written by :func:`write_chat_stream`.

    Picklable: a loader's collate process reads its rank's part itself. Build it in the
    rank's own process (LitData takes the rank from ``torch.distributed`` there).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = str(directory)
        counts_file = Path(directory, COUNTS_FILE)
        if not counts_file.is_file():
            raise StreamError(f"{directory} is not a stream written by write_chat_stream")
        self.counts: dict[str, int] = json.loads(counts_file.read_text())
        self.num_records = self.counts.get("kept", 0)
        layout_file = Path(directory, LAYOUT_FILE)
        self.layout: str | None = (
            json.loads(layout_file.read_text())["layout"] if layout_file.is_file() else None
        )
        self._dataset: Any = None

    def _stream(self) -> Any:
        return require_litdata().StreamingDataset(self.directory, shuffle=False, drop_last=False)

    def part(self, world_size: int, rank: int) -> StreamPart:
        """This rank's part, as LitData deals it; checked against ``world_size`` and
        ``rank`` (those of the loader). Keeps the reader :meth:`records` uses, built here,
        in the rank's process, so that a collate process reads the same part."""
        if self.num_records == 0:  # no chunk was written: nothing to deal
            return StreamPart(0, 0)
        probe = self._stream()
        env = probe.distributed_env
        if (env.world_size, env.global_rank) != (world_size, rank):
            raise StreamError(
                f"LitData sees rank {env.global_rank} of {env.world_size}, the loader is rank "
                f"{rank} of {world_size}: build the stream's loader after "
                "torch.distributed.init_process_group, in the rank's own process"
            )
        count = len(probe)
        try:
            first = next(iter(probe))["index"] if count else 0
        except ValueError as error:  # UnicodeDecodeError: a damaged chunk
            raise self.undecodable(None, error) from error
        self._dataset = self._stream()
        return StreamPart(first, count)

    def records(self, part: StreamPart, offset: int) -> Iterator[tuple[int, ChatRecord]]:
        """``(index, record)`` of the part from its ``offset``-th record on, in order.

        Raises:
            StreamError: A record is not at the place its index says, or the part ends
                early (the data changed since the part was dealt).
        """
        stream = self._dataset
        if stream is None:
            raise StreamError("ChatStream.part() deals this rank its part before records()")
        stream.reset_state_dict()  # an abandoned iteration must not resume here
        if offset:
            state = stream.state_dict(num_samples_yielded=offset, num_workers=1, batch_size=1)
            stream.load_state_dict(state)
        expected = part.first + offset
        items = iter(stream)
        while True:
            try:
                item = next(items, None)
                record = None if item is None else self._decoded(item)
            except ValueError as error:  # UnicodeDecodeError, bad JSON: a damaged chunk
                raise self.undecodable(expected, error) from error
            if item is None:
                break
            if item["index"] != expected:
                raise StreamError(
                    f"the stream at {self.directory} gave record {item['index']} where this "
                    f"rank's part has record {expected}: LitData dealt the records otherwise"
                )
            yield expected, record
            expected += 1
        if expected != part.first + part.count:
            raise StreamError(
                f"the stream at {self.directory} ended at record {expected}, this rank's part "
                f"runs to {part.first + part.count - 1}"
            )

    @staticmethod
    def _decoded(item: dict[str, Any]) -> ChatRecord:
        return {"id": item["id"], "messages": json.loads(item["messages"])}

    def undecodable(self, index: int | None, error: Exception) -> StreamError:
        """The error of record ``index`` (``None``: the first of this rank's part), which
        cannot be decoded: it names the record, its chunk (LitData's ``index.json``) and
        what to delete. LitData decodes a record with its neighbours in the chunk, so the
        damage may lie in one of those."""
        record = "the first record of this rank's part" if index is None else f"record {index}"
        chunk = "" if index is None else f" ({self._chunk_of(index)})"
        return StreamError(
            f"{record} of the stream at {self.directory}{chunk} cannot be decoded, with the "
            "records LitData reads with it: "
            f"{type(error).__name__}: {error}. The stream is damaged: delete {self.directory} "
            "and the next run converts the source again"
        )

    def _chunk_of(self, index: int) -> str:
        """The chunk file that holds record ``index`` (LitData's ``index.json``)."""
        try:
            chunks = json.loads(Path(self.directory, "index.json").read_text())["chunks"]
        except (OSError, ValueError, KeyError):
            return "its chunk unknown: index.json is unreadable"
        ends = itertools.accumulate(chunk["chunk_size"] for chunk in chunks)
        for chunk, end in zip(chunks, ends, strict=True):
            if index < end:
                return str(chunk["filename"])
        return f"beyond the {len(chunks)} chunks of index.json"


class StreamedChatDataset(ChatDataset):
    """The tokenizing half of :class:`ChatDataset` for streamed records: a worker gets the
    record with its request and calls :meth:`tokenize_record`; there is no random access.

    ``len()`` is the number of records in the stream, so sample ids (record indices) are
    checked against it.
    """

    def __init__(
        self, num_records: int, tokenizer: ChatTokenizer, max_seq_len: int, **kwargs: Any
    ) -> None:
        super().__init__(_NoRandomAccess(num_records), tokenizer, max_seq_len, **kwargs)

    def record_id(self, index: int) -> str | int:
        raise LookupError("a streamed record's id travels with the record")

    def __getitem__(self, index: int) -> Sample:
        raise TypeError(
            f"streamed dataset[{index}]: a stream has no random access; its records reach "
            "the workers with their requests (data.streaming=true)"
        )


class _NoRandomAccess:
    """A sequence of ``n`` records whose items cannot be read."""

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        raise TypeError("a stream has no random access")
