"""Records without a chat template: plain ``text`` (language modelling, every token
supervised) and plain ``prompt``/``completion`` (loss on the completion only), as TRL
trains its standard, non-conversational datasets.

Such a record is stored as turns of the roles ``prompt`` and ``completion``
(:data:`PLAIN_ROLES`; a ``text`` record is one ``completion`` turn), so it rides through
the record table, the length pass and the loaders like a conversation. Its tokens are the
prompt's, then the completion's and the tokenizer's end-of-sequence id, no other token
added (no begin-of-sequence id, no template); the completion and its end-of-sequence id
are supervised. The chat template's default system prompt and the augmentation do not
apply to it. A plain record is one turn to learn: longer than ``max_seq_len``, it is
dropped under ``data.sizes.truncation=turns`` or ``drop`` and cut under ``tail``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from odb_lightning.data.chat_formats import Truncation
from odb_lightning.data.conversation import Message
from odb_lightning.data.template import ChatTemplate, TokenizedChat
from odb_lightning.sample import IGNORE_INDEX, BadSampleError

PROMPT, COMPLETION = "prompt", "completion"
PLAIN_ROLES = (PROMPT, COMPLETION)
"""The roles of a plain record's turns."""


def is_plain(messages: Sequence[Any]) -> bool:
    """Whether a record's turns are a plain record's (any turn of a plain role)."""
    return any(isinstance(m, dict) and m.get("role") in PLAIN_ROLES for m in messages)


def tokenize_plain(
    template: ChatTemplate,
    messages: Sequence[Message],
    max_seq_len: int | None = None,
    truncation: Truncation = Truncation.TURNS,
) -> TokenizedChat:
    """The plain record's ids and labels (the module docstring), cut or dropped."""
    roles = [m.get("role") for m in messages]
    if roles not in ([COMPLETION], [PROMPT, COMPLETION]):
        raise BadSampleError(
            None, "messages", f"a plain record is [prompt,] completion, got {roles}"
        )
    tokenizer = template.tokenizer
    prompt = tokenizer.encode_text(messages[0]["content"]) if len(messages) == 2 else []
    completion = [*tokenizer.encode_text(messages[-1]["content"]), tokenizer.eos_id]
    input_ids = prompt + completion
    labels = [IGNORE_INDEX] * len(prompt) + completion
    full_length = len(input_ids)
    if max_seq_len is None or full_length <= max_seq_len:
        return TokenizedChat(input_ids, labels, full_length)
    cut = TokenizedChat(input_ids[:max_seq_len], labels[:max_seq_len], full_length)
    if truncation is not Truncation.TAIL or cut.num_loss_tokens == 0:
        return TokenizedChat(cut.input_ids, [IGNORE_INDEX] * cut.length, full_length, dropped=True)
    return cut


def tokenize_record(
    template: ChatTemplate,
    messages: Sequence[Message],
    max_seq_len: int | None = None,
    truncation: Truncation = Truncation.TURNS,
) -> TokenizedChat:
    """A record's ids and labels: a plain record's own rule, else the chat template's."""
    if is_plain(messages):
        return tokenize_plain(template, messages, max_seq_len, truncation)
    return template.tokenize(messages, max_seq_len, truncation)
