"""The input pipeline that runs inside the loader workers.

Sources yield conversations (:class:`ChatRecord`); :class:`ChatDataset` applies the ChatML
template and tokenizer per item. Imports torch, tokenizer and data libraries, the core and
the sample contract (:mod:`odb_lightning.sample`); never the runtime, Lightning or Hydra.
"""

from odb_lightning.data.augment import DEFAULT_SYSTEM_PROMPTS, Augmentation, augment_messages
from odb_lightning.data.conversation import BadRecordError, ChatRecord, Message, Role
from odb_lightning.data.dataset import ChatDataset, TokenizedDataset
from odb_lightning.data.hf_tokenizer import HFTokenizer, export_hf_tokenizer, load_tokenizer
from odb_lightning.data.length_cache import (
    CachedLengths,
    LengthCache,
    length_fingerprint,
    source_parts,
    source_version,
)
from odb_lightning.data.lengths import (
    LengthReport,
    LengthStats,
    OverLength,
    measure_source,
    source_lengths,
)
from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.data.sources import (
    ShareGPTRegime,
    SourceName,
    SourceRecords,
    chitchat_records,
    jsonl_records,
    load_source,
    sharegpt_records,
    ultrachat_records,
)
from odb_lightning.data.synthetic import (
    LENGTH_PROFILES,
    LengthProfile,
    SyntheticDataset,
)
from odb_lightning.data.template import QWEN25_SYSTEM_PROMPT, ChatMLTemplate, TokenizedChat
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.sample import (
    IGNORE_INDEX,
    BadSampleError,
    Sample,
    SampleStats,
    count_loss_tokens,
    inspect_sample,
)

__all__ = [
    "IGNORE_INDEX",
    "BadSampleError",
    "Sample",
    "SampleStats",
    "count_loss_tokens",
    "inspect_sample",
    "DEFAULT_SYSTEM_PROMPTS",
    "LENGTH_PROFILES",
    "QWEN25_SYSTEM_PROMPT",
    "Augmentation",
    "BadRecordError",
    "CachedLengths",
    "ChatDataset",
    "ChatMLTemplate",
    "ChatRecord",
    "ChatTokenizer",
    "HFTokenizer",
    "LengthCache",
    "LengthProfile",
    "LengthReport",
    "LengthStats",
    "Message",
    "OverLength",
    "QwenTokenizer",
    "Role",
    "ShareGPTRegime",
    "SourceName",
    "SourceRecords",
    "SyntheticDataset",
    "TokenizedChat",
    "TokenizedDataset",
    "augment_messages",
    "chitchat_records",
    "export_hf_tokenizer",
    "jsonl_records",
    "length_fingerprint",
    "load_source",
    "load_tokenizer",
    "measure_source",
    "sharegpt_records",
    "source_lengths",
    "source_parts",
    "source_version",
    "ultrachat_records",
]
