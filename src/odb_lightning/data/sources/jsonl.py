"""The generic user path: the user's conversations as they keep them.

The files (:mod:`odb_lightning.data.sources.files`: JSON Lines, a JSON array, parquet, a
folder or glob of them, a ``save_to_disk`` folder) hold one record per row in one of the
layouts of :mod:`odb_lightning.data.formats` (``messages``, ShareGPT, Alpaca,
``prompt_completion``, ``text``), detected
from the first record or named by ``data.source.format``. ``id`` is optional (the row's
1-based number in its file is used; with several files, where it is in which file:
``a.jsonl:3``, ``b.json[2]``, ``c.parquet#5``). Roles
go through the same aliases as every source. Blank lines are skipped. Any other problem
(invalid UTF-8 or JSON, a missing or empty conversation, a bad role or content) raises
:class:`~odb_lightning.data.conversation.BadRecordError` naming the file, the line or
row and the field, before any training starts; with ``on_bad_record="skip"`` the record
is dropped and counted instead.

Ids need not be unique (batching and the id audit go by line, i.e. dataset index): a
repeated id is counted (``duplicate_ids``) and logged with both line numbers, never
silently merged or dropped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from odb_lightning.data.conversation import BadRecordError, ChatRecord
from odb_lightning.data.formats import (
    AUTO,
    FieldMapping,
    Format,
    detect_format,
    format_named,
    from_messages,
)
from odb_lightning.data.sources.files import Row, data_files, file_lines, iter_rows
from odb_lightning.data.sources.source_records import (
    SourceReader,
    SourceRecords,
    checked_max_samples,
    source_version,
)
from odb_lightning.data.sources.table import SourceRequest

logger = logging.getLogger(__name__)


class OnBadRecord(StrEnum):
    """What a line that cannot become a conversation does."""

    RAISE = "raise"
    SKIP = "skip"


def decode_line(raw: bytes, where: str) -> Any:
    """A JSON Lines line's value, or an error naming the line and what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRecordError(where, "<line>", f"invalid UTF-8 at byte {error.start}") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        # A character offset: the line's own newline would make colno refer to "line 2".
        # Some of json's messages end in "at" ("Unterminated string starting at").
        problem = f"invalid JSON: {error.msg.removesuffix(' at')} at character {error.pos}"
        raise BadRecordError(where, "<line>", problem) from error


def record_object(payload: bytes | Any, where: str) -> dict[str, Any]:
    """A row as a JSON object (a line decoded first)."""
    value = decode_line(payload, where) if isinstance(payload, bytes) else payload
    if not isinstance(value, dict):
        raise BadRecordError(where, "<line>", f"must be a JSON object, got {type(value).__name__}")
    return value


def parse_jsonl_line(raw: bytes, where: str, line_number: int) -> ChatRecord:
    """Parse one ``messages`` line into a record (the streamed path's layout).

    Args:
        where: ``"<file>:<line>"`` for error messages.
        line_number: 1-based line number, the id when the line has none.

    Raises:
        BadRecordError: Invalid UTF-8 or JSON, not an object, bad ``id`` or ``messages``.
    """
    return from_messages(record_object(raw, where), where, line_number)


class RecordParser:
    """Rows to records in one layout: the named one, or the one the first JSON object
    shows (:func:`~odb_lightning.data.formats.detect_format`), kept for every later row."""

    def __init__(
        self, layout: str, several_files: bool, mapping: FieldMapping | None = None
    ) -> None:
        self.format: Format | None = mapping.layout if mapping else format_named(layout)
        self.several_files = several_files

    def __call__(self, payload: bytes | Any, where: str, number: int) -> ChatRecord:
        value = record_object(payload, where)
        if self.format is None:
            self.format = detect_format(value, where)
        # With several files a row is named by its file's name and its place in it.
        default_id: str | int = Path(where).name if self.several_files else number
        return self.format.convert(value, where, default_id)


def jsonl_source(
    path: str | Path,
    *,
    max_samples: int | None = None,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
    layout: str = AUTO,
    mapping: FieldMapping | None = None,
) -> SourceReader:
    """The reader of :func:`jsonl_records` (records one at a time, for a record table):
    records in ``layout`` (``auto``: detected), or in the user's own ``mapping``."""
    on_bad_record = OnBadRecord(on_bad_record)
    format_named(layout)  # a wrong name fails now

    def read(result: SourceRecords) -> Iterator[ChatRecord]:
        first_row: dict[str | int, int] = {}
        files = data_files(path)
        parse = RecordParser(layout, len(files) > 1, mapping)

        def keep(record: ChatRecord, number: int, result: SourceRecords) -> None:
            if not result.detected and parse.format is not None:
                result.detected = parse.format.name
            _note_duplicate(record["id"], number, first_row, result, Path(path))

        skip = on_bad_record is OnBadRecord.SKIP
        limit = checked_max_samples(max_samples)
        return _parsed_rows(iter_rows(files), parse, limit, skip, result, keep)

    arguments = {"max_samples": max_samples, "on_bad_record": on_bad_record.value}
    if layout != AUTO:
        arguments["format"] = layout
    if mapping is not None:
        arguments["mapping"] = mapping.as_json()
    return SourceReader("jsonl", read, source_version("jsonl", path), arguments)


def jsonl_records(
    path: str | Path,
    *,
    max_samples: int | None = None,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
) -> SourceRecords:
    """Read conversations from a JSON Lines file into memory (the data module reads them
    through a record table instead: :mod:`odb_lightning.data.record_table`).

    Args:
        max_samples: Stop after this many records.
        on_bad_record: ``"raise"`` at the first bad line, or ``"skip"`` it (counted under
            ``dropped/bad_record``, its message kept in ``rejected``).

    Returns:
        The records, counts ``read`` (non-blank lines), ``kept`` and ``duplicate_ids``
        (records whose id an earlier line already had), and ``dropped/bad_record`` when
        skipping.
    """
    return jsonl_source(path, max_samples=max_samples, on_bad_record=on_bad_record).collect()


SKIP_HINT = "to skip bad lines and train on the rest: batching.loader.on_bad_sample=skip"
"""Said in the error of a bad line under ``raise``."""
LOGGED_SKIPS = 5
"""Skipped lines named in the log, each with its file, line and reason (all of them are
in the source's ``rejected`` list)."""


def iter_jsonl_lines(
    path: str | Path,
    parse: Callable[[bytes, str, int], Any],
    max_samples: int | None,
    on_bad_record: OnBadRecord | str,
    result: SourceRecords,
    keep: Callable[[Any, int, SourceRecords], None] | None = None,
) -> Iterator[Any]:
    """Parse every non-blank line of a JSON Lines file with ``parse(raw, where, line)``:
    at most ``max_samples`` records, a bad line raised or (``skip``) counted under
    ``dropped/bad_record`` in ``result`` with its message in ``result.rejected``; ``keep``
    sees each good record before it is yielded. Counts ``read``.

    Raises:
        FileNotFoundError: ``path`` is not a file (when called, before any line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data.source.path={str(path)!r}: no such JSON Lines file")
    limit = checked_max_samples(max_samples)
    skip = OnBadRecord(on_bad_record) is OnBadRecord.SKIP
    return _parsed_rows(file_lines(path), parse, limit, skip, result, keep)


def _parsed_rows(
    rows: Iterator[Row],
    parse: Callable[[Any, str, int], Any],
    limit: int | None,
    skip: bool,
    result: SourceRecords,
    keep: Callable[[Any, int, SourceRecords], None] | None,
) -> Iterator[Any]:
    kept = 0
    for where, number, payload in rows:
        if limit is not None and kept >= limit:
            break
        result.counts["read"] += 1
        try:
            record = parse(payload, where, number)
        except BadRecordError as error:
            if not skip:
                problem = f"{error.problem} ({SKIP_HINT})"
                raise BadRecordError(error.record, error.field, problem) from error
            result.counts["dropped/bad_record"] += 1
            result.rejected.append(str(error))
            if result.counts["dropped/bad_record"] <= LOGGED_SKIPS:
                logger.warning("skipped %s", error)
            continue
        if keep is not None:
            keep(record, number, result)
        kept += 1
        yield record


def _note_duplicate(
    record_id: str | int,
    line_number: int,
    first_line: dict[str | int, int],
    result: SourceRecords,
    path: Path,
) -> None:
    first = first_line.setdefault(record_id, line_number)
    if first == line_number:
        return
    result.counts["duplicate_ids"] += 1
    if result.counts["duplicate_ids"] == 1:  # one line per file, the count says the rest
        warning = (
            f"{path}: id {record_id!r} on line {line_number} repeats line {first}; both are "
            "kept (records are told apart by line, see duplicate_ids in the source counts)"
        )
        result.warnings.append(warning)
        logger.warning("%s", warning)


def reader(request: SourceRequest) -> SourceReader:
    """The source table's reader of ``jsonl`` (the files, ``max_samples``, bad records,
    the layout)."""
    return jsonl_source(
        request.path,
        max_samples=request.max_samples,
        on_bad_record=request.on_bad_record,
        layout=request.format,
        mapping=FieldMapping(**request.mapping) if request.mapping else None,
    )
