"""Chat templates of other model families, and the tokenizer's own template through
Hugging Face ``apply_chat_template``.

A renderer turns a conversation into :class:`Span` s of text, each marked supervised or
not and, for message text, with the message field it came from. The whole text is then
tokenized in one pass by the model's own tokenizer, exactly as ``apply_chat_template``
would tokenize it, and a token is supervised when its characters overlap a supervised
span. Supervised are the assistant's content and its end-of-turn token, nothing else.

A control token (``<|eot_id|>``, ``<end_of_turn>``, ...) spelled inside message text
would be read as a real control token by the one-pass tokenization (and by
``apply_chat_template``); such a message is a bad sample naming the field (skipped and
counted with ``on_bad_sample=skip``), never a conversation the model sees with a turn
boundary the user did not write.

Layouts, as the families' Hugging Face chat templates render them:

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

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from odb_lightning.data.conversation import Message, Role
from odb_lightning.sample import IGNORE_INDEX, BadSampleError

if TYPE_CHECKING:
    from odb_lightning.data.hf_tokenizer import HFTokenizer


class TemplateName(StrEnum):
    """Chat templates ``data.source.template`` selects."""

    AUTO = "auto"
    CHATML = "chatml"
    QWEN3 = "qwen3"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    GEMMA = "gemma"
    HF = "hf"


@dataclass(frozen=True, slots=True)
class Span:
    """A piece of rendered text: supervised or not; ``field`` names message text."""

    text: str
    supervised: bool = False
    field: str | None = None


def _content(position: int) -> str:
    return f"messages[{position}].content"


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
        else:
            spans.append(Span(" "))
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
                spans.append(Span(think, bool(reasoning), _content(k)))
                content = content.lstrip("\n")
        spans.append(Span(content, supervised, _content(k)))
        spans.append(Span("<|im_end|>", supervised))
        spans.append(Span("\n"))
    return spans


REQUIRED_TOKENS: dict[TemplateName, tuple[str, ...]] = {
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


def _overlapping(offsets: Sequence[tuple[int, int]], ranges: Sequence[tuple[int, int]]):
    """For each token ``(start, end)``, the index of a range it overlaps, else ``-1``
    (ranges sorted and disjoint)."""
    starts = [r[0] for r in ranges]
    found = []
    for start, end in offsets:
        i = bisect.bisect_right(starts, max(start, end - 1)) - 1
        hit = i >= 0 and start < ranges[i][1] and end > ranges[i][0] and end > start
        found.append(i if hit else -1)
    return found


class RenderedTemplate:
    """A family's layout (:data:`TemplateName`), tokenized by its Hugging Face tokenizer.

    Args:
        tokenizer: An :class:`~odb_lightning.data.hf_tokenizer.HFTokenizer` (it gives the
            character offsets that map supervision onto tokens).
        name: ``qwen3``, ``llama3``, ``mistral`` or ``gemma``.
    """

    def __init__(self, tokenizer: HFTokenizer, name: TemplateName) -> None:
        self.tokenizer, self.name = tokenizer, name

    def spans(self, messages: Sequence[Message]) -> list[Span]:
        if self.name is TemplateName.LLAMA3:
            return render_llama3(messages)
        if self.name is TemplateName.GEMMA:
            return render_gemma(messages)
        if self.name is TemplateName.QWEN3:
            return render_qwen3(messages)
        backend = self.tokenizer.backend
        return render_mistral(messages, backend.bos_token or "<s>", backend.eos_token or "</s>")

    def render(self, messages: Sequence[Message]) -> str:
        return "".join(span.text for span in self.spans(messages))

    def tokenize(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """Token ids and labels of the whole conversation (not truncated)."""
        spans = self.spans(messages)
        supervised, content, fields, position = [], [], [], 0
        for span in spans:
            end = position + len(span.text)
            if span.supervised and end > position:
                supervised.append((position, end))
            if span.field is not None and end > position:
                content.append((position, end))
                fields.append(span.field)
            position = end
        backend = self.tokenizer.backend
        text = "".join(span.text for span in spans)
        encoding = backend(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(encoding["input_ids"]), list(encoding["offset_mapping"])
        self._refuse_control_tokens_in_text(ids, offsets, content, fields)
        hits = _overlapping(offsets, supervised)
        labels = [t if hit >= 0 else IGNORE_INDEX for t, hit in zip(ids, hits, strict=True)]
        return ids, labels

    def _refuse_control_tokens_in_text(self, ids, offsets, content, fields) -> None:
        controls = self.tokenizer.control_token_ids
        for token_id, hit in zip(ids, _overlapping(offsets, content), strict=True):
            if hit >= 0 and token_id in controls:
                token = self.tokenizer.backend.convert_ids_to_tokens(token_id)
                raise BadSampleError(
                    None,
                    fields[hit],
                    f"contains {token!r}, a control token of the {self.name} template: "
                    "the model would read a turn boundary the data does not have",
                )


class HFChatTemplate:
    """The tokenizer's own Jinja chat template, through ``apply_chat_template`` with
    ``return_assistant_tokens_mask``: the template marks the assistant tokens with
    ``{% generation %}`` blocks, so supervision is what its author put in them."""

    name = TemplateName.HF

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[Message]) -> str:
        return self.tokenizer.backend.apply_chat_template(list(messages), tokenize=False)

    def tokenize(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        # The template's text is tokenized with control tokens parsed: refuse them in
        # message text, as the shipped layouts do.
        for k, message in enumerate(messages):
            token = self.tokenizer.find_control_token(message["content"])
            if token is not None:
                raise BadSampleError(
                    None,
                    _content(k),
                    f"contains {token!r}, a control token of the tokenizer's own template: "
                    "the model would read a turn boundary the data does not have",
                )
        from jinja2 import TemplateError

        try:
            encoding = self.tokenizer.backend.apply_chat_template(
                [dict(m) for m in messages],
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
        except TemplateError as error:  # e.g. raise_exception('roles must alternate ...')
            problem = f"is refused by the tokenizer's own chat template: {error}"
            raise BadSampleError(None, "messages", problem) from error
        ids, mask = list(encoding["input_ids"]), list(encoding["assistant_masks"])
        return ids, [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
