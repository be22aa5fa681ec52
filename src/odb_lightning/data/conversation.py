"""Conversations as every source yields them, role normalization, and the bad-record error."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, TypedDict


class Role(StrEnum):
    """The three ChatML roles every source is mapped onto."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class Message(TypedDict):
    """One chat turn: ``role`` is a :class:`Role` value, ``content`` plain text."""

    role: str
    content: str


class ChatRecord(TypedDict):
    """One conversation as every source yields it."""

    id: str | int
    messages: list[Message]


# Speaker names seen in the wild (ShareGPT exports, Gemini-style "model") -> ChatML role.
ROLE_ALIASES: dict[str, Role] = {
    "system": Role.SYSTEM,
    "user": Role.USER,
    "human": Role.USER,
    "assistant": Role.ASSISTANT,
    "gpt": Role.ASSISTANT,
    "chatgpt": Role.ASSISTANT,
    "bing": Role.ASSISTANT,
    "bard": Role.ASSISTANT,
    "model": Role.ASSISTANT,
}


class BadRecordError(ValueError):
    """A source record that cannot become a conversation.

    Attributes:
        record: Where the record is: its id, or ``"<file>:<line>"`` for line-based files.
        field: The offending field, e.g. ``"messages[2].role"``.
        problem: What is wrong with it.
    """

    def __init__(self, record: str | int, field: str, problem: str) -> None:
        super().__init__(f"record {record}: field {field!r}: {problem}")
        self.record = record
        self.field = field
        self.problem = problem


def normalize_role(raw: Any, record: str | int, field: str) -> str:
    """Map a speaker name onto a :class:`Role` value, or raise :class:`BadRecordError`."""
    role = ROLE_ALIASES.get(raw.lower()) if isinstance(raw, str) else None
    if role is None:
        known = ", ".join(sorted(ROLE_ALIASES))
        raise BadRecordError(record, field, f"unknown role {raw!r} (known: {known})")
    return role.value


SUPERVISED_ROLES = (Role.ASSISTANT.value, "completion")
"""The roles whose turns carry a loss: the assistant's, and a plain record's completion
(:mod:`odb_lightning.data.plain_text`)."""


def has_assistant(messages: Iterable[Message]) -> bool:
    """Whether any turn is supervised (SFT trains on assistant turns and plain
    completions only)."""
    return any(m["role"] in SUPERVISED_ROLES for m in messages)
