"""The ChatML template Qwen uses, with standard SFT label masking.

Rendered text, one block per message::

    <|im_start|>{role}\\n{content}<|im_end|>\\n

``labels`` are ``-100`` everywhere except the assistant content tokens and the assistant's
closing ``<|im_end|>``: the model learns to answer and to stop, never to imitate the user,
the system prompt or the role headers.

The header ``"{role}\\n"`` and the content are tokenized separately, so the supervised span
starts exactly at the first content token. This matches tokenizing the whole rendered text
token-for-token except when content starts with whitespace that BPE would merge with the
header's newline (rare; every SFT framework that masks by span does the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.data.conversation import Message, Role
from odb_lightning.data.tokenizer import IM_END, IM_START, ChatTokenizer
from odb_lightning.sample import IGNORE_INDEX, BadSampleError, count_loss_tokens

QWEN25_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_ROLES = frozenset(role.value for role in Role)


@dataclass(frozen=True, slots=True)
class TokenizedChat:
    """A conversation after the template.

    Attributes:
        input_ids: Token ids, at most ``max_seq_len`` of them.
        labels: Same length; ``-100`` where there is no loss.
        full_length: Length before truncation.
    """

    input_ids: list[int]
    labels: list[int]
    full_length: int

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def truncated(self) -> bool:
        return self.full_length > len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return count_loss_tokens(self.labels)


class ChatMLTemplate:
    """Render and tokenize conversations in ChatML.

    Args:
        tokenizer: Any :class:`ChatTokenizer`.
        system_prompt: Prepended as a system message when a conversation has none; ``None``
            adds nothing. Qwen2.5's own default is :data:`QWEN25_SYSTEM_PROMPT`.
    """

    def __init__(self, tokenizer: ChatTokenizer, system_prompt: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self._headers: dict[str, list[int]] = {}
        self._newline: list[int] = []

    def _header(self, role: str) -> list[int]:
        """``<|im_start|>{role}\\n``, tokenized once per role."""
        if role not in self._headers:
            ids = [self.tokenizer.im_start_id, *self.tokenizer.encode_text(f"{role}\n")]
            self._headers[role] = ids
        return self._headers[role]

    def _closing(self) -> tuple[int, list[int]]:
        if not self._newline:
            self._newline = self.tokenizer.encode_text("\n")
        return self.tokenizer.im_end_id, self._newline

    def with_system_prompt(self, messages: Sequence[Message]) -> list[Message]:
        """The messages as rendered: the default system prompt first, if one applies."""
        messages = list(messages)
        first_is_system = bool(messages) and messages[0].get("role") == Role.SYSTEM.value
        if self.system_prompt is not None and not first_is_system:
            messages.insert(0, {"role": Role.SYSTEM.value, "content": self.system_prompt})
        return messages

    def render(self, messages: Sequence[Message]) -> str:
        """The template as text (for inspection; tokenization does not go through it)."""
        return "".join(
            f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n"
            for m in self.with_system_prompt(messages)
        )

    def tokenize(
        self, messages: Sequence[Message], max_seq_len: int | None = None
    ) -> TokenizedChat:
        """Tokenize a conversation, mask labels, then right-truncate to ``max_seq_len``.

        Raises:
            BadSampleError: A message is not ``{"role": system|user|assistant, "content": str}``
                (``index`` is ``None`` here; the dataset fills it in).
        """
        input_ids: list[int] = []
        labels: list[int] = []
        im_end, newline = self._closing()
        for position, message in enumerate(self.with_system_prompt(messages)):
            role, content = _checked_message(message, position)
            header = self._header(role)
            body = [*self.tokenizer.encode_text(content), im_end]
            input_ids += [*header, *body, *newline]
            supervised = body if role == Role.ASSISTANT.value else [IGNORE_INDEX] * len(body)
            labels += [IGNORE_INDEX] * len(header) + supervised + [IGNORE_INDEX] * len(newline)
        full_length = len(input_ids)
        if max_seq_len is not None:
            input_ids, labels = input_ids[:max_seq_len], labels[:max_seq_len]
        return TokenizedChat(input_ids, labels, full_length)


def _checked_message(message: object, position: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise BadSampleError(None, f"messages[{position}]", "must be a dict with role/content")
    role, content = message.get("role"), message.get("content")
    if role not in _ROLES:
        raise BadSampleError(None, f"messages[{position}].role", f"unknown role {role!r}")
    if not isinstance(content, str):
        raise BadSampleError(
            None, f"messages[{position}].content", f"must be str, got {type(content).__name__}"
        )
    return role, content
