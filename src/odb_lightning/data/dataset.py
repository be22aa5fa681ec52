"""Map-style datasets whose items are ready-to-batch samples.

Every item is ``{"input_ids": LongTensor[L], "labels": LongTensor[L]}`` (1-D), the shape
:func:`~odb_lightning.sample.inspect_sample` checks and the collates consume. A
:class:`ChatDataset` sample cut to ``max_seq_len`` also carries
``TRUNCATED_FROM: int`` (its length before the cut, ``data.sizes.truncation``), which the
collates ignore and the loader's epoch statistics count
(:func:`~odb_lightning.sample.is_truncated`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from odb_lightning.data.augment import Augmentation, augment_messages
from odb_lightning.data.chat_formats import Supervision, ThinkBlock, Truncation
from odb_lightning.data.conversation import ChatRecord, has_assistant
from odb_lightning.data.plain_text import is_plain, tokenize_record
from odb_lightning.data.sources.arrow_records import ArrowRecords
from odb_lightning.data.template_choice import (
    PROBED_RECORDS,
    build_chat_template,
    template_fingerprint,
)
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.sample import TRUNCATED_FROM, BadSampleError, Sample

__all__ = ["TRUNCATED_FROM", "ChatDataset", "TokenizedDataset", "as_sample"]


def as_sample(input_ids: Sequence[int], labels: Sequence[int]) -> Sample:
    """Build a sample dict from id and label lists."""
    return {
        "input_ids": torch.tensor(input_ids, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
    }


class ChatDataset(Dataset[Sample]):
    """Conversations tokenized with the chat template when they are read.

    Tokenization happens in ``__getitem__``, i.e. inside the loader workers, which is where
    online batching observes lengths.

    Args:
        records: Conversations (any random-access sequence of :class:`ChatRecord`).
        max_seq_len: The most tokens of a sample; ``truncation`` says what happens to a
            longer one (``data.sizes.truncation``).
        system_prompt: Default system prompt for conversations that have none (after
            augmentation, which may already have given one).
        template: The chat template (``data.source.template``): ``auto``, ``chatml``, ``qwen3``,
            ``llama3``, ``mistral``, ``gemma`` or ``hf``, chosen and checked here, before
            any sample is read, on a probe that includes the first records
            (:func:`~odb_lightning.data.template_choice.build_chat_template`).
        augmentation: Seeded per-epoch augmentation, applied before the template; it
            depends on :meth:`set_epoch`, so workers must see the current epoch.
        think_block: ``data.source.think_block``.
        supervise: ``data.source.supervise``: which turns carry the loss.
    """

    def __init__(
        self,
        records: Sequence[ChatRecord],
        tokenizer: ChatTokenizer,
        max_seq_len: int,
        system_prompt: str | None = None,
        augmentation: Augmentation | None = None,
        template: str = "auto",
        truncation: Truncation | str = Truncation.TURNS,
        think_block: ThinkBlock | str = ThinkBlock.GENERATION,
        supervise: Supervision | str = Supervision.ASSISTANT,
    ) -> None:
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.records = records
        self.max_seq_len = max_seq_len
        self.truncation = Truncation(truncation)
        self.template = build_chat_template(
            tokenizer, template, system_prompt, think_block, self._first_chats(records),
            supervise,
        )  # fmt: skip
        self.augmentation = augmentation
        self.epoch = 0

    @staticmethod
    def _first_chats(records: Sequence[ChatRecord]) -> list[Any]:
        """The first conversations of ``records`` for the template's start-up probe
        (plain records and malformed ones left out: they are not the template's)."""
        chats = []
        for index in range(min(len(records), PROBED_RECORDS)):
            try:
                messages = records[index].get("messages")
            except (KeyError, IndexError, TypeError, AttributeError):
                continue
            if isinstance(messages, list) and messages and not is_plain(messages):
                chats.append(messages)
        return chats

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose augmentation ``__getitem__`` applies."""
        self.epoch = epoch

    def length_settings(self) -> dict[str, object]:
        """Everything in this dataset that decides sample lengths, for a length-cache key
        (the source's own identity is added by the caller)."""
        augmented = self.augmentation is not None and self.augmentation.enabled
        return {
            "num_records": len(self.records),
            "tokenizer": self.template.tokenizer.fingerprint,
            "template": template_fingerprint(self.template),
            "system_prompt": self.template.system_prompt,
            "max_seq_len": self.max_seq_len,
            "truncation": self.truncation.value,
            "augmentation": self.augmentation.fingerprint if augmented else None,
        }

    def __len__(self) -> int:
        return len(self.records)

    def record_id(self, index: int) -> str | int:
        """The source id of the record at ``index`` (ids need not be unique)."""
        return self.records[index]["id"]

    def unsupervised_indices(self, indices: Sequence[int]) -> list[int]:
        """Those of ``indices`` whose record has no assistant turn, so no supervised token.

        No tokenizer: records in an Arrow table answer from its role column at once
        (:attr:`~odb_lightning.data.sources.arrow_records.ArrowRecords.supervised`), others
        by a scan of their turns. A record whose assistant turns are all cut off by
        ``max_seq_len`` (``data.sizes.truncation``; or dropped by augmentation) is not found
        here; the length pass and the loader's epoch statistics count those.
        """
        if isinstance(self.records, ArrowRecords):
            chosen = np.asarray(indices, dtype=np.int64)
            return chosen[~self.records.supervised[chosen]].tolist()
        unsupervised = []
        for index in indices:
            record: Any = self.records[index]
            messages = record.get("messages") if isinstance(record, dict) else None
            if not isinstance(messages, list) or not has_assistant(
                m for m in messages if isinstance(m, dict) and "role" in m
            ):
                unsupervised.append(index)
        return unsupervised

    def __getitem__(self, index: int) -> Sample:
        return self.tokenize_record(self.records[index], index)

    def tokenize_record(self, record: Any, index: int) -> Sample:
        """The sample of ``record``, the record at dataset ``index`` (which seeds its
        augmentation and names it in errors)."""
        if not isinstance(record, dict):
            problem = f"is missing: the record is a {type(record).__name__}, not a dict"
            raise BadSampleError(index, "messages", problem)
        messages = record.get("messages")
        if not isinstance(messages, list):
            kind = type(messages).__name__
            problem = "is missing" if messages is None else f"must be a list, got {kind}"
            raise BadSampleError(index, "messages", problem)
        if not messages:
            raise BadSampleError(index, "messages", "is empty: a conversation needs a turn")
        if self.augmentation is not None and not is_plain(messages):
            messages = augment_messages(messages, self.augmentation, self.epoch, index)
        try:
            chat = tokenize_record(self.template, messages, self.max_seq_len, self.truncation)
        except BadSampleError as error:
            raise error.at_index(index) from error
        sample = as_sample(chat.input_ids, chat.labels)
        if chat.truncated:
            sample[TRUNCATED_FROM] = chat.full_length  # type: ignore[assignment]
        return sample


class TokenizedDataset(Dataset[Sample]):
    """Already-tokenized samples, e.g. for tests or a cached corpus.

    Args:
        samples: ``(input_ids, labels)`` pairs; ``labels=None`` supervises every token.
    """

    def __init__(self, samples: Sequence[tuple[Sequence[int], Sequence[int] | None]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        input_ids, labels = self.samples[index]
        return as_sample(input_ids, input_ids if labels is None else labels)
