"""Streamed samples: where a rank's part of a stream meets the grouping window.

A stream has no random access, so the engine's requests are served in order: this
rank's shard of an epoch is its part of the stream (the record ids ``first .. first +
count - 1``) less the ids consumed before a resume, and the window requests shard
positions in ascending order. :class:`StreamSource` reads the part once, in order, and
hands each requested record to a worker with its request, which tokenizes it there; the
records between two requested ones (consumed before the resume) are read and passed over.
So the window, the rounds and the alignment are those of a fixed shard of that size
(``shard_dealing=fixed``): the epoch ends by the join drain or the non-join quota rule,
whatever the parts' sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.runtime.messages import FetchRequest, FetchResult


class StreamPartLike(Protocol):
    """A rank's part of a stream: the record ids ``first .. first + count - 1``."""

    first: int
    count: int


class RecordStream(Protocol):
    """Records read in order (e.g. :class:`~odb_lightning.data.stream.ChatStream`)."""

    num_records: int

    def part(self, world_size: int, rank: int) -> StreamPartLike:
        """This rank's part (called in the rank's own process)."""
        ...

    def records(self, part: Any, offset: int) -> Iterator[tuple[int, Any]]:
        """``(id, record)`` of ``part`` from its ``offset``-th record on, in order."""
        ...


@dataclass(frozen=True)
class RankStream:
    """One rank's part of a stream, picklable for the collate process."""

    stream: RecordStream
    part: StreamPartLike

    def shard(self, epoch: int) -> list[int]:
        """The part's record ids, in stream order: the rank's shard (``shard_dealing=fixed``)
        in every epoch."""
        return list(range(self.part.first, self.part.first + self.part.count))


def check_streamable(policy: OnlinePolicy, shard: object, order: object) -> None:
    """Refuse a stream with settings that need random access or another dealing."""
    if policy.by_need:
        raise ValueError(
            "a stream is read in order, each rank its own part, but "
            "batching.policy.shard_dealing=by_need deals one global order across ranks "
            "(random access): set batching.policy.shard_dealing=fixed"
        )
    if shard is not None or order is not None:
        raise ValueError("stream= deals each rank its part of the stream: give no shard=/order=")


class StreamSource:
    """A sample source that attaches each requested record, read from the rank's part
    in order, to its request before ``inner`` (the workers) tokenizes it."""

    def __init__(self, inner: Any, stream: RankStream, rank: int) -> None:
        self._inner = inner
        self._stream = stream
        self._rank = rank
        self._records: Iterator[tuple[int, Any]] | None = None
        self._epoch: int | None = None
        self._next_id = 0

    def submit(self, request: FetchRequest) -> None:
        self._inner.submit(replace(request, record=self._record(request)))

    def receive(self) -> FetchResult:
        return self._inner.receive()

    def _record(self, request: FetchRequest) -> Any:
        wanted = request.dataset_index
        if self._records is None or request.epoch != self._epoch or wanted < self._next_id:
            # An epoch starts (or resumes) at its first id: the engine restarts there.
            offset = wanted - self._stream.part.first
            self._records = self._stream.stream.records(self._stream.part, offset)
            self._epoch, self._next_id = request.epoch, wanted
        for record_id, record in self._records:
            self._next_id = record_id + 1
            if record_id == wanted:
                return record
            if record_id > wanted:
                break
        raise RuntimeError(
            f"rank {self._rank}'s part of the stream has no record {wanted} after record "
            f"{self._next_id - 1} "
            f"(its part: records {self._stream.part.first} to "
            f"{self._stream.part.first + self._stream.part.count - 1})"
        )
