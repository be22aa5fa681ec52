"""The input pipeline that runs inside DataLoader workers.

Sources yield conversations (:class:`ChatRecord`); :class:`ChatDataset` applies the ChatML
template and tokenizer per item; :func:`inspect_sample` checks each sample. The collates
that pad or pack a group live in :mod:`odb_lightning.runtime.batch`. Imports torch and
tokenizer/data libraries, never Lightning or Hydra.
"""

from odb_lightning.data.augment import DEFAULT_SYSTEM_PROMPTS, Augmentation, augment_messages
from odb_lightning.data.conversation import BadRecordError, ChatRecord, Message, Role
from odb_lightning.data.dataset import ChatDataset, TokenizedDataset
from odb_lightning.data.hf_tokenizer import HFTokenizer, export_hf_tokenizer
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
from odb_lightning.data.sample import (
    IGNORE_INDEX,
    BadSampleError,
    Sample,
    SampleStats,
    inspect_sample,
)
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
from odb_lightning.data.template import (
    QWEN25_SYSTEM_PROMPT,
    ChatMLTemplate,
    TokenizedChat,
    count_loss_tokens,
)
from odb_lightning.data.tokenizer import ChatTokenizer, QwenTokenizer, load_tokenizer

__all__ = [
    "DEFAULT_SYSTEM_PROMPTS",
    "IGNORE_INDEX",
    "LENGTH_PROFILES",
    "QWEN25_SYSTEM_PROMPT",
    "Augmentation",
    "BadRecordError",
    "BadSampleError",
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
    "Sample",
    "SampleStats",
    "ShareGPTRegime",
    "SourceName",
    "SourceRecords",
    "SyntheticDataset",
    "TokenizedChat",
    "TokenizedDataset",
    "augment_messages",
    "chitchat_records",
    "count_loss_tokens",
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
    "inspect_sample",
]
