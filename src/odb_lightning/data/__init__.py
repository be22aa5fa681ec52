"""The input pipeline that runs inside the loader workers.

Sources yield conversations (:class:`ChatRecord`); :class:`ChatDataset` applies the chat
template and tokenizer per item. Imports torch, tokenizer and data libraries, the core and
the sample contract (:mod:`odb_lightning.sample`); never the runtime, Lightning or Hydra.

Importing the package is cheap: each name below loads its module when it is first used,
so a command line can check its arguments before torch and the tokenizers load.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Augmentation": "odb_lightning.data.augment",
    "BadRecordError": "odb_lightning.data.conversation",
    "BadSampleError": "odb_lightning.sample",
    "CachedLengths": "odb_lightning.data.length_cache",
    "ChatDataset": "odb_lightning.data.dataset",
    "ChatRecord": "odb_lightning.data.conversation",
    "ChatTemplate": "odb_lightning.data.template",
    "ChatTokenizer": "odb_lightning.data.tokenizer",
    "DEFAULT_SYSTEM_PROMPTS": "odb_lightning.data.augment",
    "HFTokenizer": "odb_lightning.data.hf_tokenizer",
    "IGNORE_INDEX": "odb_lightning.sample",
    "LENGTH_PROFILES": "odb_lightning.data.synthetic",
    "LengthCache": "odb_lightning.data.length_cache",
    "LengthProfile": "odb_lightning.data.synthetic",
    "LengthReport": "odb_lightning.data.lengths",
    "LengthStats": "odb_lightning.data.lengths",
    "Message": "odb_lightning.data.conversation",
    "OverLength": "odb_lightning.data.lengths",
    "QWEN25_SYSTEM_PROMPT": "odb_lightning.data.template",
    "QwenTokenizer": "odb_lightning.data.qwen_bpe",
    "Role": "odb_lightning.data.conversation",
    "SOURCES": "odb_lightning.data.sources.table",
    "Sample": "odb_lightning.sample",
    "SampleStats": "odb_lightning.sample",
    "SourceKind": "odb_lightning.data.sources.table",
    "SourceRecords": "odb_lightning.data.sources",
    "SyntheticDataset": "odb_lightning.data.synthetic",
    "ThinkBlock": "odb_lightning.data.chat_formats",
    "TokenizedChat": "odb_lightning.data.template",
    "TokenizedDataset": "odb_lightning.data.dataset",
    "Truncation": "odb_lightning.data.chat_formats",
    "augment_messages": "odb_lightning.data.augment",
    "build_chat_template": "odb_lightning.data.template_choice",
    "count_loss_tokens": "odb_lightning.sample",
    "export_hf_tokenizer": "odb_lightning.data.hf_tokenizer",
    "inspect_sample": "odb_lightning.sample",
    "length_fingerprint": "odb_lightning.data.length_cache",
    "load_source": "odb_lightning.data.sources",
    "load_tokenizer": "odb_lightning.data.hf_tokenizer",
    "measure_source": "odb_lightning.data.lengths",
    "source_lengths": "odb_lightning.data.lengths",
    "source_parts": "odb_lightning.data.length_cache",
    "source_version": "odb_lightning.data.length_cache",
}
"""Each public name and the module that defines it."""


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
