"""Chit Chat Challenge (``chitchat-dataset``, MIT): human-human chats.

Each chat is a list of turns, a turn being one or more utterances by the same person.
Turns alternate between the two people; the one who opens the chat becomes ``user``, the
other ``assistant``. Utterances of a turn are joined with newlines. Single-turn chats
(nobody answered) have no assistant turn and are dropped and counted (record counts:
``docs/data.md``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from odb_lightning.data.conversation import ChatRecord, Message, Role, has_assistant
from odb_lightning.data.sources.source_records import (
    SourceReader,
    SourceRecords,
    source_version,
    take,
)
from odb_lightning.data.sources.table import SourceRequest


def chitchat_path() -> Path:
    """The JSON file bundled with ``chitchat-dataset``."""
    import chitchat_dataset

    return Path(chitchat_dataset.__file__).parent / "dataset.json"


def _messages(chat: dict[str, Any]) -> list[Message]:
    turns = chat.get("messages") or []
    opener = turns[0][0]["sender"] if turns and turns[0] else None
    return [
        {
            "role": (Role.USER if turn[0]["sender"] == opener else Role.ASSISTANT).value,
            "content": "\n".join(utterance["text"] for utterance in turn),
        }
        for turn in turns
        if turn
    ]


def chitchat_source(*, max_samples: int | None = None) -> SourceReader:
    """The reader of :func:`chitchat_records` (records one at a time, for a record table)."""

    def read(result: SourceRecords) -> Iterator[ChatRecord]:
        chats: dict[str, Any] = json.loads(chitchat_path().read_text(encoding="utf-8"))

        def generate() -> Iterator[ChatRecord]:
            for chat_id, chat in chats.items():
                result.counts["read"] += 1
                messages = _messages(chat)
                if not has_assistant(messages):
                    result.counts["dropped/no_assistant"] += 1
                    continue
                yield ChatRecord(id=chat_id, messages=messages)

        return take(generate(), max_samples)

    arguments = {"max_samples": max_samples}
    return SourceReader("chitchat", read, source_version("chitchat"), arguments)


def chitchat_records(*, max_samples: int | None = None) -> SourceRecords:
    """Chit Chat conversations as user/assistant records, in memory (the data module
    reads them through a record table).

    Args:
        max_samples: Keep at most this many records (after dropping unanswered chats).

    Returns:
        Records with the chat's UUID as id, and counts ``read``,
        ``dropped/no_assistant`` and ``kept``.
    """
    return chitchat_source(max_samples=max_samples).collect()


def reader(request: SourceRequest) -> SourceReader:
    """The source table's reader of ``chitchat`` (``max_samples``)."""
    return chitchat_source(max_samples=request.max_samples)
