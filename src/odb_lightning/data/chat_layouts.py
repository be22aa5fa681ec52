"""What a chat layout gives the template: the conversation's whole text and the character
ranges of it that are supervised. The text is then tokenized in one pass
(:meth:`~odb_lightning.data.tokenizer.ChatTokenizer.encode_rendered`), as
``apply_chat_template`` tokenizes it, and a token is supervised when its characters
overlap a supervised range (:func:`supervised_tokens`).

Two kinds of layout:

- :class:`SpanLayout`: a built-in layout (:mod:`~odb_lightning.data.chat_formats`), whose
  renderer marks the supervised pieces as it writes them.
- :class:`OwnTemplate`: the tokenizer's own Jinja chat template. Where the template marks
  the assistant's tokens with ``{% generation %}`` blocks, those are supervised (what its
  author marked). Otherwise each assistant turn is found by rendering the conversation
  before it with ``add_generation_prompt=True``: the turn's supervised range runs from the
  end of that prompt through the first control token after it, its end-of-turn token.
  Where the template renders that prompt unlike the whole conversation, the turn starts
  where its content does, with the spaces the template puts before it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from odb_lightning.data.chat_formats import (
    TemplateName,
    render_chatml,
    render_gemma,
    render_llama3,
    render_mistral,
    render_qwen3,
)
from odb_lightning.data.conversation import Message, Role
from odb_lightning.sample import BadSampleError

if TYPE_CHECKING:
    from odb_lightning.data.hf_tokenizer import HFTokenizer
    from odb_lightning.data.tokenizer import ChatTokenizer

Ranges = list[tuple[int, int]]
"""Sorted, disjoint ``(start, end)`` character ranges."""


@dataclass(frozen=True, slots=True)
class Rendering:
    """A conversation as the tokenizer reads it: ``text``, and the ``supervised`` ranges."""

    text: str
    supervised: Ranges


def overlapping(offsets: Sequence[tuple[int, int]], ranges: Ranges) -> list[bool]:
    """For each token ``(start, end)``, whether it overlaps one of ``ranges``."""
    starts = [r[0] for r in ranges]
    found = []
    for start, end in offsets:
        i = bisect.bisect_right(starts, max(start, end - 1)) - 1
        found.append(i >= 0 and end > start and start < ranges[i][1] and end > ranges[i][0])
    return found


class SpanLayout:
    """A built-in layout (``chatml``, ``qwen3``, ``llama3``, ``mistral``, ``gemma``)."""

    def __init__(self, tokenizer: ChatTokenizer, name: TemplateName) -> None:
        self.tokenizer, self.name = tokenizer, name

    def text(self, messages: Sequence[Message]) -> str:
        """The conversation's text, without the supervision."""
        return self.render(messages).text

    def render(self, messages: Sequence[Message]) -> Rendering:
        if self.name is TemplateName.MISTRAL:
            backend = self.tokenizer.backend  # type: ignore[attr-defined]
            spans = render_mistral(
                messages, backend.bos_token or "<s>", backend.eos_token or "</s>"
            )
        else:
            renderer = {
                TemplateName.CHATML: render_chatml,
                TemplateName.QWEN3: render_qwen3,
                TemplateName.LLAMA3: render_llama3,
                TemplateName.GEMMA: render_gemma,
            }[self.name]
            spans = renderer(messages)
        supervised, position = [], 0
        for span in spans:
            end = position + len(span.text)
            if span.supervised and end > position:
                if supervised and supervised[-1][1] == position:
                    supervised[-1] = (supervised[-1][0], end)
                else:
                    supervised.append((position, end))
            position = end
        return Rendering("".join(span.text for span in spans), supervised)


def has_generation_blocks(template: str) -> bool:
    """Whether a Jinja chat template marks its assistant tokens (``{% generation %}``)."""
    import re

    return re.search(r"{%-?\s*generation\s*-?%}", template) is not None


class OwnTemplate:
    """The tokenizer's own chat template (``data.source.template=hf``; the module
    docstring says how its supervised ranges are found)."""

    name = TemplateName.HF

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self.tokenizer = tokenizer

    def _apply(self, messages: Sequence[Message], **options: object):
        from jinja2 import TemplateError

        try:
            return self.tokenizer.backend.apply_chat_template(
                [dict(m) for m in messages], **options
            )
        except TemplateError as error:  # e.g. raise_exception('roles must alternate ...')
            problem = f"is refused by the tokenizer's own chat template: {error}"
            raise BadSampleError(None, "messages", problem) from error

    def text(self, messages: Sequence[Message]) -> str:
        """The conversation's text, without the supervision."""
        return self._apply(messages, tokenize=False)

    def render(self, messages: Sequence[Message]) -> Rendering:
        text = self._apply(messages, tokenize=False)
        if has_generation_blocks(self.tokenizer.chat_template or ""):
            return Rendering(text, self._marked(messages))
        supervised = []
        for k, message in enumerate(messages):
            if message["role"] == Role.ASSISTANT.value:
                start = self._turn_start(messages, k, text)
                supervised.append((start, self._turn_end(text, start, k)))
        return Rendering(text, supervised)

    def _marked(self, messages: Sequence[Message]) -> Ranges:
        """The characters of the tokens the template's ``{% generation %}`` blocks mark."""
        encoding = self._apply(
            messages,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            tokenizer_kwargs={"return_offsets_mapping": True},
        )
        ranges: Ranges = []
        for (start, end), marked in zip(
            encoding["offset_mapping"], encoding["assistant_masks"], strict=True
        ):
            if marked and end > start:
                if ranges and ranges[-1][1] >= start:
                    ranges[-1] = (ranges[-1][0], max(end, ranges[-1][1]))
                else:
                    ranges.append((start, end))
        return ranges

    def _turn_start(self, messages: Sequence[Message], k: int, text: str) -> int:
        """Where assistant turn ``k`` starts: the end of the prompt before it, where the
        template renders that prompt as in the whole conversation; else where its content
        starts, with the spaces the template puts before it (Mistral v0.3 moves the
        system prompt into the last user turn, so its prompts differ)."""
        if k > 0:
            prompt = self._apply(messages[:k], tokenize=False, add_generation_prompt=True)
            if text.startswith(prompt):
                return len(prompt)
        sentinel = "\ue000"
        marked = [*messages[:k], {**messages[k], "content": sentinel}, *messages[k + 1 :]]
        before = self._apply(marked, tokenize=False).partition(sentinel)[0]
        if len(before) == len(self._apply(marked, tokenize=False)) or not text.startswith(before):
            raise BadSampleError(
                None,
                f"messages[{k}]",
                "the tokenizer's own chat template renders the turns before this one "
                "unlike the whole conversation, so its supervised tokens cannot be found: "
                "set data.source.template to a built-in layout",
            )
        return len(before.rstrip(" \t")) if before.strip(" \t") else len(before)

    def _turn_end(self, text: str, start: int, k: int) -> int:
        token = self.tokenizer.find_control_token(text[start:])
        if token is None:
            raise BadSampleError(
                None,
                f"messages[{k}]",
                "the tokenizer's own chat template closes this assistant turn with no "
                "control token, so its end of turn cannot be found: set "
                "data.source.template to a built-in layout",
            )
        return text.index(token, start) + len(token)
