"""What the chat template needs from a tokenizer, and the ChatML control-token names.

Backends (:mod:`~odb_lightning.data.qwen_bpe`, :mod:`~odb_lightning.data.hf_tokenizer`)
encode message text *ordinarily*: a literal ``<|im_end|>`` typed by a user is text, never
a control token. The template adds the real control tokens by id, so the only way a
special token enters a sample is through the template. Tokenizer objects are sent to
loader workers, so they pickle as a few strings and load their encoding lazily.
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
