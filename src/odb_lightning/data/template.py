"""Chat templates: the ChatML one Qwen uses (below), the other families' layouts
(:mod:`~odb_lightning.data.chat_formats`), and the choice among them at startup
(:func:`build_chat_template`), all with standard SFT label masking.

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

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.data.chat_formats import (
    REQUIRED_TOKENS,
    HFChatTemplate,
    RenderedTemplate,
    TemplateName,
)
from odb_lightning.data.conversation import Message, Role
from odb_lightning.data.hf_tokenizer import HFTokenizer
from odb_lightning.data.tokenizer import IM_END, IM_START, ChatTokenizer
from odb_lightning.sample import IGNORE_INDEX, BadSampleError, count_loss_tokens

logger = logging.getLogger(__name__)

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

    name = TemplateName.CHATML

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


def _with_system_prompt(messages: Sequence[Message], system_prompt: str | None) -> list[Message]:
    messages = list(messages)
    first_is_system = bool(messages) and messages[0].get("role") == Role.SYSTEM.value
    if system_prompt is not None and not first_is_system:
        messages.insert(0, {"role": Role.SYSTEM.value, "content": system_prompt})
    return messages


class FamilyTemplate:
    """Any non-ChatML template behind :class:`ChatMLTemplate`'s interface: the default
    system prompt, message checks and right-truncation to ``max_seq_len``.

    Args:
        layout: A :class:`~odb_lightning.data.chat_formats.RenderedTemplate` or
            :class:`~odb_lightning.data.chat_formats.HFChatTemplate`.
    """

    def __init__(
        self, layout: RenderedTemplate | HFChatTemplate, system_prompt: str | None = None
    ) -> None:
        self.layout, self.system_prompt = layout, system_prompt
        self.name, self.tokenizer = layout.name, layout.tokenizer

    def with_system_prompt(self, messages: Sequence[Message]) -> list[Message]:
        return _with_system_prompt(messages, self.system_prompt)

    def render(self, messages: Sequence[Message]) -> str:
        return self.layout.render(self.with_system_prompt(messages))

    def tokenize(
        self, messages: Sequence[Message], max_seq_len: int | None = None
    ) -> TokenizedChat:
        """Tokenize, mask labels, right-truncate (see :meth:`ChatMLTemplate.tokenize`)."""
        checked: list[Message] = []
        for position, message in enumerate(self.with_system_prompt(messages)):
            role, content = _checked_message(message, position)
            checked.append({"role": role, "content": content})
        input_ids, labels = self.layout.tokenize(checked)
        full_length = len(input_ids)
        if max_seq_len is not None:
            input_ids, labels = input_ids[:max_seq_len], labels[:max_seq_len]
        return TokenizedChat(input_ids, labels, full_length)


ChatTemplate = ChatMLTemplate | FamilyTemplate
"""What :class:`~odb_lightning.data.dataset.ChatDataset` tokenizes with."""

_GENERATION_BLOCK = re.compile(r"{%-?\s*generation\s*-?%}")
# Markers of each family's layout in a tokenizer's own Jinja template, most specific first.
_MARKERS = (
    ("<|start_header_id|>", TemplateName.LLAMA3),
    ("<start_of_turn>", TemplateName.GEMMA),
    ("[INST]", TemplateName.MISTRAL),
)
_PROBE: list[Message] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a color."},
    {"role": "assistant", "content": "Blue."},
]
_SHIPPED = ", ".join(n.value for n in TemplateName if n not in (TemplateName.AUTO,))


def _detect(tokenizer: ChatTokenizer) -> TemplateName:
    """``data.source.template=auto``: the tokenizer's own template where it marks assistant
    tokens, else the shipped layout its template (or its vocabulary) shows."""
    own = tokenizer.chat_template if isinstance(tokenizer, HFTokenizer) else None
    if own is not None and _GENERATION_BLOCK.search(own):
        return TemplateName.HF
    if own is not None:
        for marker, name in _MARKERS:
            if marker in own:
                return name
        if IM_START in own:
            return TemplateName.QWEN3 if "<think>" in own else TemplateName.CHATML
    elif not isinstance(tokenizer, HFTokenizer) or tokenizer.has_token(IM_END):
        return TemplateName.CHATML
    kind = "its chat template" if own is not None else "it has no chat template and"
    raise ValueError(
        f"template=auto: tokenizer {tokenizer!r}: {kind} matches none of the shipped "
        f"layouts ({_SHIPPED}), and no {{% generation %}} block marks its assistant "
        "tokens for apply_chat_template: set data.source.template to one of them"
    )


def _check_tokens(tokenizer: ChatTokenizer, name: TemplateName) -> None:
    if name is TemplateName.CHATML:
        if isinstance(tokenizer, HFTokenizer):
            missing = [t for t in (IM_START, IM_END) if not tokenizer.has_token(t)]
        else:
            missing = []
    elif not isinstance(tokenizer, HFTokenizer):
        raise ValueError(
            f"template={name.value} needs a Hugging Face tokenizer (tokenizer=hf), got "
            f"{tokenizer!r}"
        )
    elif name is TemplateName.HF:
        own = tokenizer.chat_template
        if own is None or not _GENERATION_BLOCK.search(own):
            raise ValueError(
                f"template=hf: the chat template of tokenizer {tokenizer!r} has no "
                "{% generation %} block, so apply_chat_template cannot mark the "
                f"assistant tokens; set data.source.template to a shipped layout ({_SHIPPED})"
            )
        missing = []
    else:
        missing = [t for t in REQUIRED_TOKENS[name] if not tokenizer.has_token(t)]
    if missing:
        raise ValueError(
            f"template={name.value}: tokenizer {tokenizer!r} lacks the control tokens "
            f"{', '.join(missing)}: its model uses another chat layout (data.source.template=auto "
            "picks it)"
        )


def _compare_with_own(template: ChatTemplate) -> None:
    """Warn when a shipped layout renders a probe conversation unlike the tokenizer's own
    template (e.g. Llama 3.1's dated system prompt): the ids the model was tuned on."""
    tokenizer = template.tokenizer
    own = tokenizer.chat_template if isinstance(tokenizer, HFTokenizer) else None
    if own is None or template.name is TemplateName.HF:
        return
    try:
        theirs = tokenizer.backend.apply_chat_template(_PROBE, tokenize=False)
    except Exception as error:  # a template may refuse the probe (e.g. no system role)
        logger.info(
            "template=%s: the tokenizer's own template refused a probe: %s",
            template.name.value,
            error,
        )
        return
    ours = template.render(_PROBE)
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        at = min(len(ours), len(theirs)) if at is None else at
        logger.warning(
            "template=%s renders a probe conversation unlike the tokenizer's own chat "
            "template from character %d: ours %r, its own %r",
            template.name.value,
            at,
            ours[max(0, at - 20) : at + 40],
            theirs[max(0, at - 20) : at + 40],
        )


def resolve_template_name(tokenizer: ChatTokenizer, template: str = "auto") -> TemplateName:
    """The template ``template`` names for ``tokenizer``, checked against its vocabulary.

    Raises:
        ValueError: An unknown name, a layout whose control tokens the tokenizer lacks,
            ``hf`` without a ``{% generation %}`` block, or ``auto`` that recognizes
            nothing. The message starts with ``template``.
    """
    try:
        name = TemplateName(template)
    except ValueError:
        choices = ", ".join(n.value for n in TemplateName)
        raise ValueError(f"template must be one of {choices}, got {template!r}") from None
    if name is TemplateName.AUTO:
        name = _detect(tokenizer)
    _check_tokens(tokenizer, name)
    return name


def build_chat_template(
    tokenizer: ChatTokenizer, template: str = "auto", system_prompt: str | None = None
) -> ChatTemplate:
    """The chat template for ``tokenizer`` (``data.source.template``), chosen and checked now.

    Args:
        template: ``auto`` (the tokenizer's own template when it has ``{% generation %}``
            blocks, else the shipped layout it shows, else ChatML for a tokenizer with
            ``<|im_start|>``/``<|im_end|>``), ``chatml``, ``qwen3``, ``llama3``,
            ``mistral``, ``gemma`` or ``hf``.
        system_prompt: Default system prompt for conversations without one.
    """
    name = resolve_template_name(tokenizer, template)
    chosen: ChatTemplate
    if name is TemplateName.CHATML:
        chosen = ChatMLTemplate(tokenizer, system_prompt)
    elif name is TemplateName.HF:
        chosen = FamilyTemplate(HFChatTemplate(tokenizer), system_prompt)  # type: ignore[arg-type]
    else:
        chosen = FamilyTemplate(RenderedTemplate(tokenizer, name), system_prompt)  # type: ignore[arg-type]
    _compare_with_own(chosen)
    return chosen


def template_fingerprint(template: ChatTemplate) -> str:
    """What of the template decides token ids, for length-cache keys: its name, and for
    ``hf`` a digest of the tokenizer's own Jinja template."""
    if template.name is not TemplateName.HF:
        return template.name.value
    own = template.tokenizer.chat_template or ""
    return f"hf:{hashlib.sha256(own.encode()).hexdigest()[:16]}"
