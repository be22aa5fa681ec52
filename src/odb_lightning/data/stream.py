"""Chat records as a stream: a JSON Lines file written once as LitData chunks, then read
by each rank in order, its own part of it, never held whole.

The engine is LitData (``litdata.streaming``): ``Cache`` writes the chunks,
``StreamingDataset`` reads them (why LitData and not a ``datasets`` iterable dataset:
``experiments/streaming/README.md``). Each item is one record, ``{"index": k, "id": ...,
"messages": <JSON text>}``, ``k`` its place among the file's kept records: the sample id
the loader, the id audit and resume use.

* **Conversion and content** (:mod:`odb_lightning.data.stream_convert`): the user's files
  written once as chunks with their page digests, checked on every open.
* **Parts** (:meth:`ChatStream.part`): LitData deals each rank a contiguous run of the
  records (``shuffle=False``, ``drop_last=False``, so parts may differ by a record and
  none is dropped). The reader checks every record's index against its place, so a
  change in LitData's dealing fails loudly instead of reading a record twice.
* **Restart** (:meth:`ChatStream.records`): from any place in the part, through the
  engine's own state (``state_dict(num_samples_yielded=...)``), without reading what is
  before it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from odb_lightning.data.conversation import ChatRecord
from odb_lightning.data.dataset import ChatDataset
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.sample import Sample

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
