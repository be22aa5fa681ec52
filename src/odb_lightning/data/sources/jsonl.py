"""The generic user path: a JSON Lines file, one conversation per line.

Each line is ``{"id": str | int, "messages": [{"role": ..., "content": str}, ...]}``;
``id`` is optional (the 1-based line number is used). Roles go through the same aliases
as every source (``human``/``gpt`` are accepted). Blank lines are skipped. Any other
problem (invalid UTF-8 or JSON, a missing or empty ``messages``, a bad role or content)
raises :class:`~odb_lightning.data.conversation.BadRecordError` naming the file, the line
number and the field, before any training starts; with ``on_bad_record="skip"`` the line
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

from odb_lightning.data.conversation import BadRecordError, ChatRecord, Message, normalize_role
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


def _parse_messages(value: Any, where: str) -> list[Message]:
    if not isinstance(value, list):
        raise BadRecordError(where, "messages", f"must be a list, got {type(value).__name__}")
    if not value:
        raise BadRecordError(where, "messages", "is empty: a conversation needs a turn")
    messages: list[Message] = []
    for k, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRecordError(where, f"messages[{k}]", "must be an object with role/content")
        content = message.get("content")
        if not isinstance(content, str):
            kind = type(content).__name__
            raise BadRecordError(where, f"messages[{k}].content", f"must be a string, got {kind}")
        role = normalize_role(message.get("role"), where, f"messages[{k}].role")
        messages.append({"role": role, "content": content})
    return messages


def parse_jsonl_line(raw: bytes, where: str, line_number: int) -> ChatRecord:
    """Parse one line into a record.

    Args:
        where: ``"<file>:<line>"`` for error messages.
        line_number: 1-based line number, the id when the line has none.

    Raises:
        BadRecordError: Invalid UTF-8 or JSON, not an object, bad ``id`` or ``messages``.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRecordError(where, "<line>", f"invalid UTF-8 at byte {error.start}") from error
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        # A character offset: the line's own newline would make colno refer to "line 2".
        # Some of json's messages end in "at" ("Unterminated string starting at").
        problem = f"invalid JSON: {error.msg.removesuffix(' at')} at character {error.pos}"
        raise BadRecordError(where, "<line>", problem) from error
    if not isinstance(value, dict):
        raise BadRecordError(where, "<line>", f"must be a JSON object, got {type(value).__name__}")
    if "messages" not in value:
        raise BadRecordError(where, "messages", "missing")
    record_id = value.get("id", line_number)
    if not isinstance(record_id, str | int) or isinstance(record_id, bool):
        raise BadRecordError(where, "id", f"must be a string or integer, got {record_id!r}")
    return ChatRecord(id=record_id, messages=_parse_messages(value["messages"], where))


def jsonl_source(
    path: str | Path,
    *,
    max_samples: int | None = None,
    on_bad_record: OnBadRecord | str = OnBadRecord.RAISE,
) -> SourceReader:
    """The reader of :func:`jsonl_records` (records one at a time, for a record table)."""
    path = Path(path)
    on_bad_record = OnBadRecord(on_bad_record)

    def read(result: SourceRecords) -> Iterator[ChatRecord]:
        first_line: dict[str | int, int] = {}

        def keep(record: ChatRecord, line_number: int, result: SourceRecords) -> None:
            _note_duplicate(record["id"], line_number, first_line, result, path)

        return iter_jsonl_lines(path, parse_jsonl_line, max_samples, on_bad_record, result, keep)

    arguments = {"max_samples": max_samples, "on_bad_record": on_bad_record.value}
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
    return _parsed_lines(path, parse, limit, skip, result, keep)


def _parsed_lines(
    path: Path,
    parse: Callable[[bytes, str, int], Any],
    limit: int | None,
    skip: bool,
    result: SourceRecords,
    keep: Callable[[Any, int, SourceRecords], None] | None,
) -> Iterator[Any]:
    kept = 0
    with path.open("rb") as file:
        for line_number, raw in enumerate(file, start=1):
            if limit is not None and kept >= limit:
                break
            if not raw.strip():
                continue
            result.counts["read"] += 1
            try:
                record = parse(raw, f"{path}:{line_number}", line_number)
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
                keep(record, line_number, result)
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
    """The source table's reader of ``jsonl`` (the file, ``max_samples``, bad lines)."""
    return jsonl_source(
        request.path, max_samples=request.max_samples, on_bad_record=request.on_bad_record
    )
