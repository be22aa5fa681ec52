"""What the chat template needs from a tokenizer, and the ChatML control-token names.

Backends (:mod:`~odb_lightning.data.qwen_bpe`, :mod:`~odb_lightning.data.hf_tokenizer`)
encode a chat template's rendered text in one pass, as ``apply_chat_template`` does: a
control token spelled in the text is the control token. So the template refuses a message
whose text spells one (:mod:`~odb_lightning.data.template`), and the only way a control
token enters a sample is through the template. :meth:`ChatTokenizer.encode_text` encodes
plain text (a plain record's, the vision family's) *ordinarily*: there a literal
``<|im_end|>`` is text. Tokenizer objects are sent to loader workers, so they pickle as a
few strings and load their encoding lazily.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


@runtime_checkable
class ChatTokenizer(Protocol):
    """What the chat template and the length pass need from a tokenizer.

    Attributes:
        pad_id: Padding id used by :func:`~odb_lightning.runtime.batch.pad_collate`.
        vocab_size: Number of ids the tokenizer can emit (ranks plus specials).
        fingerprint: Stable string that changes whenever token ids could change; it keys
            length caches.
    """

    im_start_id: int
    im_end_id: int
    eos_id: int
    pad_id: int

    @property
    def vocab_size(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def encode_text(self, text: str) -> list[int]:
        """Encode plain text; special-token strings in it stay ordinary text."""
        ...

    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Encode a chat template's whole text in one pass, control tokens spelled in it
        read as control tokens (``apply_chat_template``'s ids), with each token's
        ``(start, end)`` character span in ``text``."""
        ...

    def find_control_token(self, text: str) -> str | None:
        """The first control token spelled in ``text``, if any."""
        ...

    def unknown_id(self) -> int | None:
        """The id a character the vocabulary cannot encode becomes (``<unk>``), if the
        tokenizer has one (a byte-level BPE has none)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Decode ids (specials included) back to text."""
        ...


@runtime_checkable
class SpecialTokens(Protocol):
    """A tokenizer that names the id of each of its special tokens (the vision family reads
    the ids that frame an image from it)."""

    def special_token_id(self, token: str) -> int:
        """The id of special ``token`` (``<|image_pad|>``); ``ValueError`` if it has none."""
        ...
