"""Which layout renders a tokenizer's conversations (``data.source.template``), decided
once at start-up and said in one log line.

``auto``: where the tokenizer carries a chat template, the ids are its
``apply_chat_template``'s. A built-in layout whose markers the template shows (``llama3``,
``gemma``, ``mistral``, ``qwen3``, ``chatml``) serves as a fast path only where it gives
the same ids and supervised tokens as the template itself on a probe: the run's first
conversations and fixed ones (with and without a system turn, leading newlines, empty
contents, unicode, code). Where the template gives chats without a system turn a default
one (Qwen2.5's), the layout gets that system prompt. Otherwise the template renders
itself (``hf``). A tokenizer without a chat template gets ``chatml`` when it has
``<|im_start|>``/``<|im_end|>`` (the bundled Qwen tokenizer).

A layout named explicitly is used as named; where the tokenizer's own template differs
on the probe, a warning says where and how.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from odb_lightning.data.chat_formats import REQUIRED_TOKENS, Supervision, TemplateName, ThinkBlock
from odb_lightning.data.chat_layouts import OwnTemplate, SpanLayout
from odb_lightning.data.conversation import Message
from odb_lightning.data.hf_tokenizer import HFTokenizer
from odb_lightning.data.template import ChatTemplate
from odb_lightning.data.tokenizer import IM_END, IM_START, ChatTokenizer
from odb_lightning.sample import IGNORE_INDEX, BadSampleError

logger = logging.getLogger(__name__)

_KEY = "data.source.template"
# Markers of each family's layout in a tokenizer's own Jinja template, most specific first.
_MARKERS = (
    ("<|start_header_id|>", TemplateName.LLAMA3),
    ("<start_of_turn>", TemplateName.GEMMA),
    ("[INST]", TemplateName.MISTRAL),
    ("<think>", TemplateName.QWEN3),
    (IM_START, TemplateName.CHATML),
)
_SHIPPED = ", ".join(n.value for n in TemplateName if n is not TemplateName.AUTO)


def _chat(*turns: str, system: str | None = None) -> list[Message]:
    roles = ("user", "assistant")
    chat = [{"role": roles[k % 2], "content": text} for k, text in enumerate(turns)]
    return ([{"role": "system", "content": system}] if system is not None else []) + chat  # type: ignore[return-value]


PROBE_CHATS: tuple[list[Message], ...] = (
    _chat("Hi there", "Hello! How can I help?"),
    _chat("Hi there", "Hello!", "Name a color.", "Blue.", system="Be brief."),
    _chat("\n\nLeading newlines", "\nAnswer after a newline\n", "  spaced  ", "\tTab."),
    _chat("", "", "Empty before", ""),
    _chat("Ünïcödé: 你好, 😀, cafe\u0301", "Привет — ça va? 🎉", system="Sys\n"),
    _chat(
        "Fix:\n```python\ndef f(x):\n    return x+1\n```",
        "```python\ndef f(x):\n    return x\n```\n",
    ),
    _chat("One", "Two", "Three", "Four", "Five", "Six"),
)
"""The fixed chats of the start-up probe, beside the run's first conversations."""
PROBED_RECORDS = 16
"""The run's first conversations in the probe."""


def _own(tokenizer: ChatTokenizer) -> OwnTemplate | None:
    if isinstance(tokenizer, HFTokenizer) and tokenizer.chat_template is not None:
        return OwnTemplate(tokenizer)
    return None


def _detect(tokenizer: ChatTokenizer) -> TemplateName:
    """``auto`` before the probe: the layout the tokenizer's own template shows, else
    ``hf``; without a template, ``chatml`` for a tokenizer with its control tokens."""
    own = tokenizer.chat_template if isinstance(tokenizer, HFTokenizer) else None
    if own is not None:
        return next((name for marker, name in _MARKERS if marker in own), TemplateName.HF)
    if not isinstance(tokenizer, HFTokenizer) or tokenizer.has_token(IM_END):
        return TemplateName.CHATML
    raise ValueError(
        f"{_KEY}=auto: tokenizer {tokenizer!r} has no chat template and none of the "
        f"built-in layouts' control tokens: set {_KEY} to one of {_SHIPPED}"
    )


def _check_tokens(tokenizer: ChatTokenizer, name: TemplateName) -> None:
    if not isinstance(tokenizer, HFTokenizer):
        if name is not TemplateName.CHATML:
            raise ValueError(
                f"{_KEY}={name.value} needs a Hugging Face tokenizer (tokenizer=hf), got "
                f"{tokenizer!r}"
            )
        return
    if name is TemplateName.HF:
        if tokenizer.chat_template is None:
            raise ValueError(
                f"{_KEY}=hf: tokenizer {tokenizer!r} has no chat template of its own; set "
                f"{_KEY} to a built-in layout ({_SHIPPED})"
            )
        return
    missing = [t for t in REQUIRED_TOKENS[name] if not tokenizer.has_token(t)]
    if missing:
        raise ValueError(
            f"{_KEY}={name.value}: tokenizer {tokenizer!r} lacks the control tokens "
            f"{', '.join(missing)}: its model uses another chat layout ({_KEY}=auto picks it)"
        )


def resolve_template_name(tokenizer: ChatTokenizer, template: str = "auto") -> TemplateName:
    """The layout ``template`` names for ``tokenizer``, checked against its vocabulary
    (for ``auto``, the candidate before the probe of :func:`build_chat_template`).

    Raises:
        ValueError: An unknown name, a layout whose control tokens the tokenizer lacks,
            ``hf`` without a chat template, or ``auto`` that finds nothing. The message
            starts with the key, ``data.source.template``.
    """
    try:
        name = TemplateName(template)
    except ValueError:
        choices = ", ".join(n.value for n in TemplateName)
        raise ValueError(f"{_KEY} must be one of {choices}, got {template!r}") from None
    if name is TemplateName.AUTO:
        name = _detect(tokenizer)
    _check_tokens(tokenizer, name)
    return name


def implied_system_prompt(own: OwnTemplate) -> tuple[str | None, bool]:
    """What the tokenizer's own template does with the system turn: the system prompt it
    gives a chat without one (``None``: none), and whether it leaves out the system turn of
    a chat that ends with an answer (Mistral v0.3's does)."""
    sentinel = "\ue001"
    chat = _chat("Hi", "Hello")
    try:
        without = own.render(chat).text
        marked = own.render([{"role": "system", "content": sentinel}, *chat]).text
    except BadSampleError:
        return None, False
    if sentinel not in marked:
        return None, True
    before, _, after = marked.partition(sentinel)
    fits = len(without) > len(before) + len(after)
    if fits and without.startswith(before) and without.endswith(after):
        return without[len(before) : len(without) - len(after)], False
    return None, False


def first_difference(
    ours: ChatTemplate, theirs: ChatTemplate, chats: Sequence[Sequence[Message]]
) -> str | None:
    """Where ``ours`` and ``theirs`` first differ on ``chats`` (:data:`PROBE_CHATS`, then
    the run's own; ids, supervised tokens, or one refusing what the other takes), said in
    words; ``None`` if nowhere."""
    for k, chat in enumerate(chats):
        fixed = len(PROBE_CHATS)
        where = f"probe chat {k}" if k < fixed else f"the run's conversation {k - fixed}"
        outcome = []
        for template in (ours, theirs):
            try:
                outcome.append(template.tokenize(chat))
            except BadSampleError as error:
                outcome.append(error)
        a, b = outcome
        if isinstance(a, BadSampleError) or isinstance(b, BadSampleError):
            if type(a) is not type(b):
                refused = a if isinstance(a, BadSampleError) else b
                return f"{where}: only one of them refuses it ({refused.problem})"
            continue
        decode = ours.tokenizer.decode
        if a.input_ids != b.input_ids:
            x, y = a.input_ids, b.input_ids
            at = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), None)
            at = min(len(x), len(y)) if at is None else at
            return (
                f"{where}: the ids differ from token {at}: the layout "
                f"{decode(x[max(0, at - 3) : at + 6])!r}, its own template "
                f"{decode(y[max(0, at - 3) : at + 6])!r}"
            )
        if a.labels != b.labels:
            at = next(i for i, (u, v) in enumerate(zip(a.labels, b.labels, strict=True)) if u != v)
            which = "the layout" if a.labels[at] != IGNORE_INDEX else "its own template"
            return (
                f"{where}: token {at} ({decode(a.input_ids[at : at + 1])!r}) is "
                f"supervised by {which} only"
            )
    return None


def build_chat_template(
    tokenizer: ChatTokenizer,
    template: str = "auto",
    system_prompt: str | None = None,
    think_block: ThinkBlock | str = ThinkBlock.GENERATION,
    records: Sequence[Sequence[Message]] = (),
    supervise: Supervision | str = Supervision.ASSISTANT,
) -> ChatTemplate:
    """The chat template for ``tokenizer`` (``data.source.template``), decided now (the
    module docstring) and said in one log line.

    Args:
        template: ``auto``, ``chatml``, ``qwen3``, ``llama3``, ``mistral``, ``gemma`` or
            ``hf`` (the tokenizer's own).
        system_prompt: Default system prompt for conversations without one.
        think_block: ``data.source.think_block``.
        records: The run's first conversations, probed beside :data:`PROBE_CHATS`.
        supervise: ``data.source.supervise``: the turns that carry the loss (the layouts
            are probed on the assistant turns' spans either way).
    """
    chosen = _chosen_template(tokenizer, template, system_prompt, think_block, records)
    supervise = Supervision(supervise)
    if supervise is Supervision.ASSISTANT:
        return chosen
    logger.info("data.source.supervise=%s: %s", supervise.value, SUPERVISED[supervise])
    return ChatTemplate(chosen.layout, chosen.system_prompt, chosen.think_block, supervise)


SUPERVISED = {
    Supervision.LAST_ASSISTANT: "the loss is on the last assistant turn of each chat only",
    Supervision.ALL: "the loss is on every token, system and user turns included",
}
"""What the log says of a supervision other than every assistant turn."""


def _chosen_template(
    tokenizer: ChatTokenizer,
    template: str,
    system_prompt: str | None,
    think_block: ThinkBlock | str,
    records: Sequence[Sequence[Message]],
) -> ChatTemplate:
    name = resolve_template_name(tokenizer, template)
    think_block = ThinkBlock(think_block)
    own = _own(tokenizer)
    if own is None:
        logger.info("%s=%s: the %s layout (the tokenizer has no chat template of its own)",
                    _KEY, template, name.value)  # fmt: skip
        return ChatTemplate(SpanLayout(tokenizer, name), system_prompt, think_block)
    reference = ChatTemplate(own, system_prompt, think_block)
    implied, drops_system = implied_system_prompt(own)
    dropped = (
        "; it leaves out the system turn of a chat that ends with an answer "
        f"({_KEY}=mistral keeps it on the first user turn)"
        if drops_system
        else ""
    )
    if name is TemplateName.HF:
        why = " (no built-in layout shows its control tokens)" if template == "auto" else ""
        logger.info("%s=%s: the tokenizer's own chat template renders each chat%s%s",
                    _KEY, template, why, dropped)  # fmt: skip
        return reference
    chats = [*PROBE_CHATS, *records[:PROBED_RECORDS]]
    if template == TemplateName.AUTO.value:
        layout_prompt = system_prompt if system_prompt is not None else implied
        candidate = ChatTemplate(SpanLayout(tokenizer, name), layout_prompt, think_block)
        difference = first_difference(candidate, reference, chats)
        if difference is None:
            given = f", with its default system prompt {implied!r}" if layout_prompt else ""
            logger.info(
                "%s=auto: the tokenizer's own chat template, through the %s layout (the "
                "same ids and supervised tokens on %d probe chats%s)%s",
                _KEY, name.value, len(chats), given, dropped,
            )  # fmt: skip
            return candidate
        logger.info(
            "%s=auto: the tokenizer's own chat template renders each chat (the %s layout "
            "differs from it: %s)%s", _KEY, name.value, difference, dropped,
        )  # fmt: skip
        return reference
    chosen = ChatTemplate(SpanLayout(tokenizer, name), system_prompt, think_block)
    difference = first_difference(chosen, reference, chats)
    if difference is None:
        logger.info("%s=%s: equal to the tokenizer's own chat template on %d probe chats",
                    _KEY, name.value, len(chats))  # fmt: skip
        return chosen
    missing = (
        f"; chats without a system turn get none, where its own template gives them "
        f"{implied!r}: set data.source.system_prompt to it"
        if implied is not None and system_prompt is None
        else ""
    )
    logger.warning(
        "%s=%s renders unlike the tokenizer's own chat template (%s)%s; %s=auto gives the "
        "ids its model was tuned on", _KEY, name.value, difference, missing, _KEY,
    )  # fmt: skip
    return chosen


def template_fingerprint(template: ChatTemplate) -> str:
    """What of the template decides token ids and labels, for length-cache keys: its name,
    think block rule and supervision, and for ``hf`` a digest of the tokenizer's own Jinja
    template."""
    named = f"{template.name.value}/think={template.think_block.value}"
    if template.supervise is not Supervision.ASSISTANT:  # the supervised-token counts change
        named += f"/supervise={template.supervise.value}"
    if template.name is not TemplateName.HF:
        return named
    own = template.tokenizer.chat_template or ""  # type: ignore[attr-defined]
    return f"{named}:{hashlib.sha256(own.encode()).hexdigest()[:16]}"
