"""Records that stay in an Arrow table: a ``datasets.Dataset`` seen as a sequence of
:class:`~odb_lightning.data.conversation.ChatRecord`, each row converted when it is read.

The table is memory-mapped, so every rank and loader worker of a machine reads the same
page-cache pages, and a dataset over it pickles as a file reference. Which records have an
assistant turn is one vectorized pass over the role column (:attr:`ArrowRecords.supervised`),
not a scan of every record's text.

:class:`TableRecords` reads the schema a record table writes
(:mod:`odb_lightning.data.record_table`): ``id_json`` (the record's id as JSON, so string
and integer ids stay apart), ``messages`` (``list<struct<role, content>>``, roles already
ChatML's), ``supervised`` (``bool``: has an assistant turn) and, for image-text sources,
``images`` (``list<string>``).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from odb_lightning.data.conversation import (
    ROLE_ALIASES,
    SUPERVISED_ROLES,
    ChatRecord,
    Role,
    has_assistant,
)
from odb_lightning.data.mapped_pages import PageRelease
from odb_lightning.sample import BadSampleError

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

ITER_BATCH_ROWS = 1024
"""Rows read at once when a table's records are iterated in order."""


def assistant_rows(messages: pa.ChunkedArray, num_rows: int) -> np.ndarray:
    """Per row of a ``list<struct<role, ...>>`` column: whether a turn's role is one of
    the assistant's names (:data:`~odb_lightning.data.conversation.ROLE_ALIASES`, any
    case), as :func:`~odb_lightning.data.conversation.has_assistant` decides after
    normalization. Reads the role strings only."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = [name for name, role in ROLE_ALIASES.items() if role is Role.ASSISTANT]
    names += [role for role in SUPERVISED_ROLES if role not in names]
    turns = pc.list_flatten(messages)
    roles = pc.utf8_lower(pc.struct_field(turns, "role"))
    is_assistant = pc.fill_null(pc.is_in(roles, value_set=pa.array(names)), False)
    rows = pc.list_parent_indices(messages).to_numpy()
    hits = rows[is_assistant.to_numpy(zero_copy_only=False)]
    return np.bincount(hits, minlength=num_rows)[:num_rows] > 0


class ArrowRecords(Sequence[ChatRecord]):
    """A ``datasets.Dataset`` as a sequence of records; a slice is a view of the table.

    Subclasses say how a row becomes a record (:meth:`record_of`).

    Args:
        table: The rows.
        offset: Index of the first row in the table this one is a slice of (a record
            without an id of its own is named by that index).
    """

    def __init__(self, table: datasets.Dataset, offset: int = 0) -> None:
        self.table, self.offset = table, offset
        # The pages each row read maps stay mapped in the reading process: released every
        # few hundred rows, so a worker's memory does not grow with the rows it has read.
        self._pages = PageRelease([entry["filename"] for entry in table.cache_files])

    @abstractmethod
    def record_of(self, row: Mapping[str, Any], index: int) -> ChatRecord:
        """The record of ``row``, row ``index`` of the whole table."""

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, index: int) -> ChatRecord: ...
    @overload
    def __getitem__(self, index: slice) -> ArrowRecords: ...

    def __getitem__(self, index: int | slice) -> ChatRecord | ArrowRecords:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]  # type: ignore[return-value]
            rows = self.table.select(range(start, max(start, stop)))
            return type(self)(rows, self.offset + start)
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} of {len(self)}")
        index %= len(self)
        try:
            row = self.table[index]
        except ValueError as error:  # UnicodeDecodeError, pyarrow's ArrowInvalid
            raise self.undecodable(index, error) from error
        self._pages.read(self.table.data.table)
        return self.record_of(row, self.offset + index)

    def undecodable(self, index: int, error: Exception) -> BadSampleError:
        """The bad sample of row ``index`` (of this view) that cannot be decoded: it names
        the row, the table file and what to delete so that it is converted again."""
        files = [entry["filename"] for entry in self.table.cache_files]
        where = files[0] if files else "an in-memory table"
        entry = str(Path(files[0]).parent) if files else "the table"
        return BadSampleError(
            index,
            "record",
            f"cannot be decoded: row {self.offset + index} of {where} raised "
            f"{type(error).__name__}: {error}. The table is damaged: delete {entry} and "
            "the next run converts the source again",
        )

    def __iter__(self) -> Iterator[ChatRecord]:
        index = self.offset
        for batch in self.table.with_format("arrow").iter(batch_size=ITER_BATCH_ROWS):
            try:
                rows = batch.to_pylist()
            except ValueError as error:  # UnicodeDecodeError, pyarrow's ArrowInvalid
                raise self.undecodable(index - self.offset, error) from error
            self._pages.read(self.table.data.table, len(rows))
            for row in rows:
                yield self.record_of(row, index)
                index += 1

    @property
    def supervised(self) -> np.ndarray:
        """Per record: whether it has an assistant turn (``bool``, one per record)."""
        return assistant_rows(self.column("messages"), len(self))

    def column(self, name: str) -> pa.ChunkedArray:
        """The table's column ``name`` as Arrow (no rows are converted)."""
        return self.table.with_format("arrow")[name]


class TableRecords(ArrowRecords):
    """The records of a record table (the schema in the module docstring)."""

    def record_of(self, row: Mapping[str, Any], index: int) -> ChatRecord:
        try:
            record: dict[str, Any] = {"id": json.loads(row["id_json"])}
        except ValueError as error:  # a damaged id that still decodes as UTF-8
            raise self.undecodable(index - self.offset, error) from error
        if "images" in row:
            record["images"] = row["images"]
        record["messages"] = row["messages"]
        return record  # type: ignore[return-value]

    @property
    def supervised(self) -> np.ndarray:
        return self.column("supervised").to_numpy()


def record_schema(images: bool) -> pa.Schema:
    """The Arrow schema of a record table (with an ``images`` column for image-text)."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    fields = [
        ("id_json", pa.string()),
        ("messages", pa.list_(message)),
        ("supervised", pa.bool_()),
    ]
    if images:
        fields.append(("images", pa.list_(pa.string())))
    return pa.schema(fields)


def table_row(record: Mapping[str, Any], images: bool) -> dict[str, Any]:
    """A record as a row of :func:`record_schema`."""
    row = {
        "id_json": json.dumps(record["id"]),
        "messages": record["messages"],
        "supervised": has_assistant(record["messages"]),
    }
    if images:
        row["images"] = record["images"]
    return row
