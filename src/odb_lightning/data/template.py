"""The chat template: a conversation to token ids and SFT labels, in one pass.

A layout (:mod:`~odb_lightning.data.chat_layouts`: a built-in one, or the tokenizer's own
Jinja template) writes the conversation's whole text and marks what is supervised; the
tokenizer encodes that text in one pass, as ``apply_chat_template`` does, so what the
template would merge stays merged; a token is supervised when its characters overlap a
supervised range. ``labels`` are ``-100`` everywhere else: the model learns to answer and
to stop, never to imitate the user, the system prompt or the role headers.

Rules every layout shares, stated once here:

- **Control tokens in text.** A conversation whose text spells a control token of the
  tokenizer (``<|im_end|>``, ``<|eot_id|>``, ...) trains nothing: its ids are still those
  of the one-pass encoding (``apply_chat_template``'s, which reads the token as a turn
  boundary the data does not have), and every label is ``-100``, so the model never learns
  that boundary. It counts as a sample without a supervised token
  (``unsupervised_samples``), as a dropped sample does.
- **Characters the vocabulary cannot encode** (a tokenizer without byte fallback would
  write ``<unk>``) make a bad sample naming the field and the character.
- **Truncation** (``data.sizes.truncation``, :class:`~odb_lightning.data.chat_formats.Truncation`)
  and **think blocks** (``data.source.think_block``,
  :class:`~odb_lightning.data.chat_formats.ThinkBlock`).

Which layout serves a tokenizer is :mod:`~odb_lightning.data.template_choice`'s decision.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.data.chat_formats import Supervision, TemplateName, ThinkBlock, Truncation
from odb_lightning.data.chat_layouts import OwnTemplate, SpanLayout, overlapping
from odb_lightning.data.conversation import Message, Role
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.sample import IGNORE_INDEX, BadSampleError, count_loss_tokens

QWEN25_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
"""The system prompt Qwen2.5's own template gives a chat without one."""
_ROLES = frozenset(role.value for role in Role)
_EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")


@dataclass(frozen=True, slots=True)
class TokenizedChat:
    """A conversation after the template.

    Attributes:
        input_ids: Token ids, at most ``max_seq_len`` of them.
        labels: Same length; ``-100`` where there is no loss.
        full_length: Length before truncation.
        dropped: Left out by the truncation (too long for ``data.sizes.truncation``, or no
            supervised token left after the cut), or spelling a control token in its text
            (the module docstring): the sample keeps its place in the epoch
            (every rank's plan and a resume stay as they are) as its first
            ``max_seq_len`` tokens without a supervised one, so it trains nothing and
            every mode counts it as unsupervised and cut.
    """

    input_ids: list[int]
    labels: list[int]
    full_length: int
    dropped: bool = False

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def truncated(self) -> bool:
        return self.full_length > len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return count_loss_tokens(self.labels)


def checked_message(message: object, position: int) -> Message:
    """``message`` as ``{"role", "content"}``, or a :class:`BadSampleError` naming it."""
    if not isinstance(message, dict):
        raise BadSampleError(None, f"messages[{position}]", "must be a dict with role/content")
    role, content = message.get("role"), message.get("content")
    if role not in _ROLES:
        raise BadSampleError(None, f"messages[{position}].role", f"unknown role {role!r}")
    if not isinstance(content, str):
        raise BadSampleError(
            None, f"messages[{position}].content", f"must be str, got {type(content).__name__}"
        )
    return {"role": role, "content": content}


def spelled_control_token(
    tokenizer: ChatTokenizer, messages: Sequence[Message]
) -> tuple[int, str] | None:
    """The first message whose text spells a control token of ``tokenizer``, and the
    token (the module docstring)."""
    for position, message in enumerate(messages):
        token = tokenizer.find_control_token(message["content"])
        if token is not None:
            return position, token
    return None


def last_run(supervised: Sequence[bool]) -> list[bool]:
    """Only the last run of supervised positions (the last assistant turn's tokens)."""
    end = len(supervised)
    while end and not supervised[end - 1]:
        end -= 1
    start = end
    while start and supervised[start - 1]:
        start -= 1
    return [start <= k < end for k in range(len(supervised))]


class ChatTemplate:
    """A layout behind the rules of the module docstring.

    Args:
        layout: A :class:`~odb_lightning.data.chat_layouts.SpanLayout` or
            :class:`~odb_lightning.data.chat_layouts.OwnTemplate`.
        system_prompt: Prepended as a system turn to conversations without one; ``None``
            adds nothing.
        think_block: Whether an empty think block is supervised (``data.source.think_block``).
        supervise: Which turns carry the loss (``data.source.supervise``): every assistant
            turn, the last one, or every token.
    """

    def __init__(
        self,
        layout: SpanLayout | OwnTemplate,
        system_prompt: str | None = None,
        think_block: ThinkBlock = ThinkBlock.GENERATION,
        supervise: Supervision = Supervision.ASSISTANT,
    ) -> None:
        self.layout, self.system_prompt = layout, system_prompt
        self.think_block = ThinkBlock(think_block)
        self.supervise = Supervision(supervise)
        self.name: TemplateName = layout.name
        self.tokenizer: ChatTokenizer = layout.tokenizer

    def with_system_prompt(self, messages: Sequence[Message]) -> list[Message]:
        """The messages as rendered: the default system prompt first, if one applies."""
        messages = list(messages)
        first_is_system = bool(messages) and messages[0].get("role") == Role.SYSTEM.value
        if self.system_prompt is not None and not first_is_system:
            messages.insert(0, {"role": Role.SYSTEM.value, "content": self.system_prompt})
        return messages

    def checked(self, messages: Sequence[Message]) -> list[Message]:
        """The messages as rendered, each checked (:func:`checked_message`)."""
        return [
            checked_message(message, position)
            for position, message in enumerate(self.with_system_prompt(messages))
        ]

    def render(self, messages: Sequence[Message]) -> str:
        """The conversation's text, as the tokenizer reads it."""
        return self.layout.text(self.checked(messages))

    def tokenize(
        self,
        messages: Sequence[Message],
        max_seq_len: int | None = None,
        truncation: Truncation = Truncation.TURNS,
    ) -> TokenizedChat:
        """Token ids and labels of a conversation, at most ``max_seq_len`` of them.

        Raises:
            BadSampleError: A message is not ``{"role": system|user|assistant, "content":
                str}`` or has a character the tokenizer cannot encode, or the layout
                refuses the conversation (``index`` is ``None`` here; the dataset fills it
                in).
        """
        checked = self.checked(messages)
        if spelled_control_token(self.tokenizer, checked) is not None:  # trains nothing
            ids, _ = self.tokenizer.encode_rendered(self.layout.text(checked))
            kept_ids = ids if max_seq_len is None else ids[:max_seq_len]
            return TokenizedChat(kept_ids, [IGNORE_INDEX] * len(kept_ids), len(ids), True)
        ids, labels = self.encode(checked)
        if max_seq_len is None or len(ids) <= max_seq_len:
            return TokenizedChat(ids, labels, len(ids))
        kept: tuple[list[int], list[int]] | None = None
        if truncation is Truncation.TAIL:
            kept = ids[:max_seq_len], labels[:max_seq_len]
        elif truncation is Truncation.TURNS:
            kept = self._last_turns(checked, max_seq_len)
        if kept is None or count_loss_tokens(kept[1]) == 0:
            kept_ids = ids[:max_seq_len]
            return TokenizedChat(kept_ids, [IGNORE_INDEX] * len(kept_ids), len(ids), dropped=True)
        return TokenizedChat(*kept, len(ids))

    def encode(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """Ids and labels of checked ``messages``, whole (the module docstring)."""
        rendering = self.layout.render(messages)
        ids, offsets = self.tokenizer.encode_rendered(rendering.text)
        supervised = overlapping(offsets, rendering.supervised)
        if self.think_block is ThinkBlock.PROMPT:
            empty = [m.span() for m in _EMPTY_THINK.finditer(rendering.text)]
            if empty:
                context = overlapping(offsets, empty)
                supervised = [s and not c for s, c in zip(supervised, context, strict=True)]
        self._refuse_unknown(ids, offsets, rendering.text, messages)
        if self.supervise is Supervision.ALL:
            return ids, list(ids)
        if self.supervise is Supervision.LAST_ASSISTANT:
            supervised = last_run(supervised)
        return ids, [t if s else IGNORE_INDEX for t, s in zip(ids, supervised, strict=True)]

    def _last_turns(
        self, messages: list[Message], max_seq_len: int
    ) -> tuple[list[int], list[int]] | None:
        """``data.sizes.truncation=turns``: the system turn and the fewest exchanges cut
        from the start that fit (a binary search: fewer turns never render longer)."""
        system = messages[:1] if messages[0]["role"] == Role.SYSTEM.value else []
        rest = messages[len(system) :]
        starts = [k for k, m in enumerate(rest) if m["role"] == Role.USER.value and k > 0]
        low, high, best = 0, len(starts) - 1, None
        while low <= high:
            middle = (low + high) // 2
            ids, labels = self.encode([*system, *rest[starts[middle] :]])
            if len(ids) <= max_seq_len:
                best, high = (ids, labels), middle - 1
            else:
                low = middle + 1
        return best

    def _refuse_unknown(
        self, ids: list[int], offsets: list[tuple[int, int]], text: str, messages: Sequence[Message]
    ) -> None:
        unknown = self.tokenizer.unknown_id()
        if unknown is None or unknown not in ids:
            return
        start, end = offsets[ids.index(unknown)]
        piece = text[start:end]
        position = next((k for k, m in enumerate(messages) if piece in m["content"]), None)
        field = "messages" if position is None else f"messages[{position}].content"
        codes = " ".join(f"U+{ord(char):04X}" for char in piece[:8])
        raise BadSampleError(
            None,
            field,
            f"has {piece!r} ({codes}), text tokenizer {self.tokenizer!r} cannot encode: it has "
            f"no byte fallback and would write its unknown token (id {unknown}); replace or "
            "remove it",
        )
