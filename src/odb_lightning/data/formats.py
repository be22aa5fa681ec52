"""The record layouts fine-tuners keep their conversations in, each turned into a
:class:`~odb_lightning.data.conversation.ChatRecord`: one table, :data:`FORMATS`.

``data.source.format=auto`` detects the layout from the first record that is a JSON
object (:func:`detect_format`); naming it skips the guess. A record that does not fit its
layout raises :class:`~odb_lightning.data.conversation.BadRecordError` naming where it is
and the field, with the fix.

- ``messages`` (OpenAI, TRL's conversational form): ``{"messages": [{"role", "content"}]}``.
- ``sharegpt``: ``{"conversations": [{"from", "value"}]}`` (or ``role``/``content`` turns),
  an optional ``system`` string; roles ``human``/``gpt``/``system`` and their aliases
  (:data:`~odb_lightning.data.conversation.ROLE_ALIASES`). Tool turns (``function_call``,
  ``observation``, ``tool``) are refused by name: the chat layouts here render the three
  roles of ChatML.
- ``alpaca``: ``{"instruction", "input", "output"}`` with optional ``system`` and
  ``history`` (``[[query, answer], ...]``): the user turn is the instruction and, when
  given, a newline and the input, as LLaMA-Factory joins them.
- ``prompt_completion`` (TRL): conversational (``prompt`` and ``completion`` lists of
  turns, rendered by the chat template) or plain (two strings: no template, loss on the
  completion, :mod:`odb_lightning.data.plain_text`).
- ``text`` (TRL's language modelling): ``{"text"}``, every token supervised, no template.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from odb_lightning.data.conversation import BadRecordError, ChatRecord, Message, normalize_role

TOOL_ROLES = ("function_call", "observation", "tool", "function")
"""Speaker names of tool turns, refused by name."""


def record_id(value: dict[str, Any], where: str, default: str | int) -> str | int:
    """The record's own ``id`` (a string or an integer), else ``default``."""
    found = value.get("id", default)
    if not isinstance(found, str | int) or isinstance(found, bool):
        raise BadRecordError(where, "id", f"must be a string or integer, got {found!r}")
    return found


def parse_turns(
    value: Any,
    where: str,
    name: str,
    role_key: str = "role",
    content_key: str = "content",
    roles: Mapping[str, str] | None = None,
) -> list[Message]:
    """The turns of a conversation field ``name`` (``role_key``/``content_key`` objects;
    ``roles`` renames speakers before the usual aliases apply)."""
    if not isinstance(value, list):
        raise BadRecordError(where, name, f"must be a list, got {type(value).__name__}")
    if not value:
        raise BadRecordError(where, name, "is empty: a conversation needs a turn")
    messages: list[Message] = []
    for k, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise BadRecordError(
                where, f"{name}[{k}]", f"must be an object with {role_key}/{content_key}"
            )
        content = turn.get(content_key)
        if not isinstance(content, str):
            kind = type(content).__name__
            raise BadRecordError(
                where, f"{name}[{k}].{content_key}", f"must be a string, got {kind}"
            )
        speaker = turn.get(role_key)
        if roles and isinstance(speaker, str):
            speaker = roles.get(speaker, speaker)
        if isinstance(speaker, str) and speaker.lower() in TOOL_ROLES:
            raise BadRecordError(
                where, f"{name}[{k}].{role_key}",
                f"tool turn {speaker!r}: the chat layouts here render system, user and "
                "assistant turns only; drop the tool turns from the data",
            )  # fmt: skip
        role = normalize_role(speaker, where, f"{name}[{k}].{role_key}")
        messages.append({"role": role, "content": content})
    return messages


def from_messages(value: dict[str, Any], where: str, default_id: str | int) -> ChatRecord:
    if "messages" not in value:
        raise BadRecordError(where, "messages", "missing")
    found_id = record_id(value, where, default_id)
    return ChatRecord(id=found_id, messages=parse_turns(value["messages"], where, "messages"))


def from_sharegpt(value: dict[str, Any], where: str, default_id: str | int) -> ChatRecord:
    turns = value.get("conversations")
    if turns is None:
        raise BadRecordError(where, "conversations", "missing")
    keys = ("from", "value")
    if isinstance(turns, list) and turns and isinstance(turns[0], dict) and "from" not in turns[0]:
        keys = ("role", "content")
    messages = parse_turns(turns, where, "conversations", *keys)
    system = value.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise BadRecordError(where, "system", f"must be a string, got {type(system).__name__}")
        if system and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system})
    return ChatRecord(id=record_id(value, where, default_id), messages=messages)


def _text(value: dict[str, Any], where: str, key: str, *, required: bool) -> str:
    text = value.get(key)
    if text is None and not required:
        return ""
    if not isinstance(text, str):
        problem = "missing" if text is None else f"must be a string, got {type(text).__name__}"
        raise BadRecordError(where, key, problem)
    return text


def from_alpaca(value: dict[str, Any], where: str, default_id: str | int) -> ChatRecord:
    instruction = _text(value, where, "instruction", required=True)
    extra = _text(value, where, "input", required=False)
    output = _text(value, where, "output", required=True)
    messages: list[Message] = []
    if system := _text(value, where, "system", required=False):
        messages.append({"role": "system", "content": system})
    history = value.get("history") or []
    if not isinstance(history, list):
        raise BadRecordError(where, "history", "must be a list of [query, answer] pairs")
    for k, pair in enumerate(history):
        if not (
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(p, str) for p in pair)
        ):
            raise BadRecordError(
                where, f"history[{k}]", "must be a [query, answer] pair of strings"
            )
        messages += [
            {"role": "user", "content": pair[0]},
            {"role": "assistant", "content": pair[1]},
        ]
    query = f"{instruction}\n{extra}" if extra else instruction
    messages += [{"role": "user", "content": query}, {"role": "assistant", "content": output}]
    return ChatRecord(id=record_id(value, where, default_id), messages=messages)


def from_prompt_completion(value: dict[str, Any], where: str, default_id: str | int) -> ChatRecord:
    prompt, completion = value.get("prompt"), value.get("completion")
    found_id = record_id(value, where, default_id)
    if isinstance(prompt, list) and isinstance(completion, list):  # conversational
        asked = parse_turns(prompt, where, "prompt")
        if any(m["role"] == "assistant" for m in asked):
            raise BadRecordError(
                where, "prompt",
                "holds an assistant turn: the chat templates here supervise every assistant "
                "turn, so the loss would not be on the completion alone; use the messages "
                "layout (every assistant turn supervised) or drop those turns",
            )  # fmt: skip
        answer = parse_turns(completion, where, "completion")
        return ChatRecord(id=found_id, messages=asked + answer)
    if isinstance(prompt, str) and isinstance(completion, str):  # plain: no template
        turns: list[Message] = [{"role": "prompt", "content": prompt}] if prompt else []
        turns.append({"role": "completion", "content": completion})
        return ChatRecord(id=found_id, messages=turns)
    kinds = f"{type(prompt).__name__} and {type(completion).__name__}"
    raise BadRecordError(
        where,
        "prompt",
        f"prompt and completion must both be strings or both lists of turns, got {kinds}",
    )


def from_text(value: dict[str, Any], where: str, default_id: str | int) -> ChatRecord:
    text = _text(value, where, "text", required=True)
    if not text:
        raise BadRecordError(where, "text", "is empty: nothing to learn from")
    return ChatRecord(
        id=record_id(value, where, default_id), messages=[{"role": "completion", "content": text}]
    )


@dataclass(frozen=True)
class FieldMapping:
    """Where a layout of the user's own keeps its turns (``data.source.mapping``, as small
    as LLaMA-Factory's ``columns`` and ``tags``): the field of the list of turns, each
    turn's role and content keys, and the speaker names to rename (``{bot: assistant}``)."""

    messages: str = "messages"
    """The field that holds the list of turns."""
    role: str = "role"
    """Each turn's key of its speaker."""
    content: str = "content"
    """Each turn's key of its text."""
    roles: dict[str, str] = field(default_factory=dict)
    """Speaker names of the data to ``system``, ``user`` or ``assistant`` (the usual
    aliases, ``human``, ``gpt``, ..., need no entry)."""

    def __post_init__(self) -> None:
        for key in ("messages", "role", "content"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(
                    f"data.source.mapping.{key} must be a field name, got {getattr(self, key)!r}"
                )
        object.__setattr__(self, "roles", {str(k): str(v) for k, v in dict(self.roles).items()})

    def convert(self, value: dict[str, Any], where: str, default_id: str | int) -> ChatRecord:
        """A record of this mapping as a conversation."""
        if self.messages not in value:
            raise BadRecordError(where, self.messages, "missing (data.source.mapping.messages)")
        turns = parse_turns(
            value[self.messages], where, self.messages, self.role, self.content, self.roles
        )
        return ChatRecord(id=record_id(value, where, default_id), messages=turns)

    @property
    def layout(self) -> Format:
        """The mapping as a layout of its own (name ``mapping``)."""
        said = f"the mapping ({self.messages}: {self.role}/{self.content})"
        return Format("mapping", said, (self.messages,), self.convert)

    def as_json(self) -> dict[str, Any]:
        """The mapping as plain values (a record table's key)."""
        return {
            "messages": self.messages,
            "role": self.role,
            "content": self.content,
            "roles": self.roles,
        }


@dataclass(frozen=True)
class Format:
    """One record layout: its name, how it is said in the log, the keys that tell it, and
    its conversion."""

    name: str
    description: str
    keys: tuple[str, ...]
    """A record with all of these keys is of this layout (:func:`detect_format`)."""
    convert: Callable[[dict[str, Any], str, str | int], ChatRecord]


# fmt: off
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        # name, as the log says it, the keys that tell it, its conversion
        Format("messages", "messages (role/content)", ("messages",), from_messages),
        Format("sharegpt", "ShareGPT (conversations: from/value)", ("conversations",),
               from_sharegpt),
        Format("alpaca", "Alpaca (instruction/input/output)", ("instruction", "output"),
               from_alpaca),
        Format("prompt_completion", "prompt/completion", ("prompt", "completion"),
               from_prompt_completion),
        Format("text", "text (every token supervised)", ("text",), from_text),
    )
}
# fmt: on
"""Every record layout by name (``data.source.format``); ``auto`` detects one."""

AUTO = "auto"


def format_named(name: str) -> Format | None:
    """The layout ``name`` (``None`` for ``auto``), or an error naming the layouts."""
    if name == AUTO:
        return None
    if name not in FORMATS:
        raise ValueError(
            f"data.source.format must be one of {AUTO}, {', '.join(FORMATS)}, got {name!r}"
        )
    return FORMATS[name]


def layout_read(name: str, mapping: FieldMapping | None) -> str:
    """How the log says the layout a reader read: ``name``'s (a layout of
    :data:`FORMATS`), or the user's ``mapping``."""
    return mapping.layout.description if mapping is not None else FORMATS[name].description


def detect_format(value: dict[str, Any], where: str) -> Format:
    """The layout of a record, from its keys (the first layout whose keys it has)."""
    for candidate in FORMATS.values():
        if all(key in value for key in candidate.keys):
            return candidate
    found = ", ".join(sorted(map(str, value))) or "none"
    known = "; ".join(f"{f.name}: {'+'.join(f.keys)}" for f in FORMATS.values())
    raise BadRecordError(
        where, "<record>",
        f"its keys ({found}) fit no known layout ({known}); rename the fields or set "
        "data.source.format",
    )  # fmt: skip
