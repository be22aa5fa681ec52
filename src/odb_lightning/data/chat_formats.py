"""The built-in chat layouts, each as its family's Hugging Face chat template renders it.

A renderer turns a conversation into :class:`Span` s of text, each marked supervised or
not and, for message text, with the message field it came from
(:class:`~odb_lightning.data.chat_layouts.SpanLayout` tokenizes their text in one pass).
Supervised are the assistant's turn as the model generates it (its content, and for
Qwen3 the think block) and its end-of-turn token, nothing else.

Layouts:

- ``chatml``: per turn ``<|im_start|>{role}\n{content}<|im_end|>\n`` (Qwen2/2.5 without
  their default system prompt, which :func:`~odb_lightning.data.template.build_chat_template`
  finds in the tokenizer's own template).

- ``llama3``: ``<|begin_of_text|>`` then per turn
  ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content.strip()}<|eot_id|>``
  (Llama 3.0; 3.1+ templates add a dated system prompt, set it as ``system_prompt``).
- ``mistral``: ``<s>[INST] {user}[/INST] {assistant.strip()}</s>`` (v0.3 spacing); a
  system prompt opens the first user turn, ``{system}\\n\\n{user}``.
- ``gemma``: ``<bos>`` then per turn ``<start_of_turn>{user|model}\\n{content.strip()}
  <end_of_turn>\\n``; a system prompt opens the first user turn (Gemma 3); turns must
  alternate user/model starting with user, as Gemma's template requires.
- ``qwen3``: ChatML, and the assistant turns after the last user turn carry a think block
  ``<think>\\n{reasoning}\\n</think>\\n\\n``, taken from ``<think>...</think>`` in the
  content; an empty think block is prompt, a non-empty one is supervised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from odb_lightning.data.conversation import Message, Role
from odb_lightning.sample import BadSampleError


class TemplateName(StrEnum):
    """Chat templates ``data.source.template`` selects."""

    AUTO = "auto"
    CHATML = "chatml"
    QWEN3 = "qwen3"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    GEMMA = "gemma"
    HF = "hf"


class Supervision(StrEnum):
    """Which tokens of a conversation carry the loss (``data.source.supervise``)."""

    ASSISTANT = "assistant"
    """Every assistant turn: its content and end-of-turn token (TRL's
    ``assistant_only_loss``, axolotl's default); the rest is context."""
    LAST_ASSISTANT = "last_assistant"
    """The last assistant turn only; earlier answers are context too."""
    ALL = "all"
    """Every token: system, user and assistant turns and their headers (TRL's
    ``completion_only_loss=False`` on a conversation, axolotl's ``train_on_inputs``)."""


class ThinkBlock(StrEnum):
    """What of an empty think block (``<think>\n\n</think>\n\n``, which Qwen3's template
    puts before the last answer when the data has no reasoning) is supervised
    (``data.source.think_block``)."""

    GENERATION = "generation"
    """Supervised, as the template's generation is (what a ``{% generation %}``-marked
    template and TRL train): the model learns to open and close it."""
    PROMPT = "prompt"
    """Context, not supervised; a think block with reasoning is supervised either way."""


class Truncation(StrEnum):
    """What happens to a conversation longer than ``data.sizes.max_seq_len``
    (``data.sizes.truncation``). Whatever the choice, a sample left without a supervised
    token is dropped: counted and named, never trained on."""

    TURNS = "turns"
    """Cut whole turns from the start, user turn and the answers after it together,
    keeping the system turn, until the rest fits; a last exchange that does not fit alone
    drops the sample. Never trains an answer without its end-of-turn token."""
    DROP = "drop"
    """Drop the sample."""
    TAIL = "tail"
    """Cut the tokens past ``max_seq_len`` (the last answer may lose its end-of-turn
    token, and the model learns an answer that does not stop)."""


@dataclass(frozen=True, slots=True)
class Span:
    """A piece of rendered text: supervised or not; ``field`` names message text."""

    text: str
    supervised: bool = False
    field: str | None = None


def _content(position: int) -> str:
    return f"messages[{position}].content"


def render_chatml(messages: Sequence[Message]) -> list[Span]:
    spans = []
    for k, message in enumerate(messages):
        supervised = message["role"] == Role.ASSISTANT.value
        spans.append(Span(f"<|im_start|>{message['role']}\n"))
        spans.append(Span(message["content"], supervised, _content(k)))
        spans.append(Span("<|im_end|>", supervised))
        spans.append(Span("\n"))
    return spans


def render_llama3(messages: Sequence[Message]) -> list[Span]:
    spans = [Span("<|begin_of_text|>")]
    for k, message in enumerate(messages):
        supervised = message["role"] == Role.ASSISTANT.value
        spans.append(Span(f"<|start_header_id|>{message['role']}<|end_header_id|>\n\n"))
        spans.append(Span(message["content"].strip(), supervised, _content(k)))
        spans.append(Span("<|eot_id|>", supervised))
    return spans


def _system_first(messages: Sequence[Message]) -> tuple[str | None, int]:
    """The system prompt (if the first turn is one) and the index of the next turn."""
    if messages and messages[0]["role"] == Role.SYSTEM.value:
        return messages[0]["content"], 1
    return None, 0


def _check_alternating(messages: Sequence[Message], start: int, family: str) -> None:
    for k in range(start, len(messages)):
        expected = Role.USER.value if (k - start) % 2 == 0 else Role.ASSISTANT.value
        if messages[k]["role"] != expected:
            raise BadSampleError(
                None,
                f"messages[{k}].role",
                f"is {messages[k]['role']!r}: the {family} template needs turns alternating "
                "user/assistant, starting with user, after an optional system turn",
            )


def render_mistral(messages: Sequence[Message], bos: str, eos: str) -> list[Span]:
    system, start = _system_first(messages)
    _check_alternating(messages, start, "mistral")
    spans = [Span(bos)]
    for k in range(start, len(messages)):
        message = messages[k]
        if message["role"] == Role.USER.value:
            spans.append(Span("[INST] "))
            if system is not None and k == start:
                spans.append(Span(system, field=_content(0)))
                spans.append(Span("\n\n"))
            spans.append(Span(message["content"], field=_content(k)))
            spans.append(Span("[/INST]"))
        else:  # the space before the answer is its own (what the model generates)
            spans.append(Span(" ", True))
            spans.append(Span(message["content"].strip(), True, _content(k)))
            spans.append(Span(eos, True))
    return spans


def render_gemma(messages: Sequence[Message]) -> list[Span]:
    system, start = _system_first(messages)
    _check_alternating(messages, start, "gemma")
    spans = [Span("<bos>")]
    for k in range(start, len(messages)):
        message = messages[k]
        supervised = message["role"] == Role.ASSISTANT.value
        spans.append(Span(f"<start_of_turn>{'model' if supervised else 'user'}\n"))
        if system is not None and k == start:
            spans.append(Span(system, field=_content(0)))
            spans.append(Span("\n\n"))
        spans.append(Span(message["content"].strip(), supervised, _content(k)))
        spans.append(Span("<end_of_turn>", supervised))
        spans.append(Span("\n"))
    return spans


def _split_reasoning(content: str) -> tuple[str, str]:
    """``(reasoning, answer)`` as Qwen3's template splits a ``<think>`` block off."""
    if "</think>" not in content:
        return "", content
    parts = content.split("</think>")
    return parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n"), parts[-1].lstrip("\n")


def render_qwen3(messages: Sequence[Message]) -> list[Span]:
    users = [k for k, m in enumerate(messages) if m["role"] == Role.USER.value]
    last_user = users[-1] if users else len(messages) - 1
    spans: list[Span] = []
    for k, message in enumerate(messages):
        role, content = message["role"], message["content"]
        spans.append(Span(f"<|im_start|>{role}\n"))
        supervised = role == Role.ASSISTANT.value
        if supervised:
            reasoning, content = _split_reasoning(content)
            if k > last_user and (k == len(messages) - 1 or reasoning):
                think = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n"
                spans.append(Span(think, True, _content(k)))
                content = content.lstrip("\n")
        spans.append(Span(content, supervised, _content(k)))
        spans.append(Span("<|im_end|>", supervised))
        spans.append(Span("\n"))
    return spans


REQUIRED_TOKENS: dict[TemplateName, tuple[str, ...]] = {
    TemplateName.CHATML: ("<|im_start|>", "<|im_end|>"),
    TemplateName.LLAMA3: (
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ),
    TemplateName.GEMMA: ("<bos>", "<start_of_turn>", "<end_of_turn>"),
    TemplateName.QWEN3: ("<|im_start|>", "<|im_end|>"),
    TemplateName.MISTRAL: (),  # bos/eos come from the tokenizer; [INST] is text in v0.1
}
