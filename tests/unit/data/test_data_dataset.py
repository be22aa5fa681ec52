"""Datasets return 1-D long samples; inspect_sample measures them; pickling."""

from __future__ import annotations

import pickle

import pytest
import torch

from odb_lightning.data import (
    IGNORE_INDEX,
    BadSampleError,
    ChatDataset,
    QwenTokenizer,
    SampleStats,
    SyntheticDataset,
    TokenizedDataset,
    inspect_sample,
)
from odb_lightning.data.dataset import TRUNCATED_FROM
from odb_lightning.runtime.stats import is_truncated

RECORDS = [
    {
        "id": f"r{i}",
        "messages": [
            {"role": "user", "content": f"Question number {i}?"},
            {"role": "assistant", "content": "Answer " * (i + 1)},
        ],
    }
    for i in range(6)
]


@pytest.fixture(scope="module")
def chat_dataset(tokenizer: QwenTokenizer) -> ChatDataset:
    return ChatDataset(RECORDS, tokenizer, max_seq_len=20)


def test_chat_dataset_items(chat_dataset: ChatDataset) -> None:
    assert len(chat_dataset) == 6 and chat_dataset.record_id(2) == "r2"
    for index in range(len(chat_dataset)):
        sample = chat_dataset[index]
        assert set(sample) - {TRUNCATED_FROM} == {"input_ids", "labels"}  # see below
        assert sample["input_ids"].dtype == torch.long and sample["input_ids"].dim() == 1
        assert sample["labels"].shape == sample["input_ids"].shape
        stats = inspect_sample(sample, index, max_seq_len=20)
        assert stats.length == sample["input_ids"].numel() <= 20
    assert chat_dataset[0]["input_ids"].numel() < 20
    # Over max_seq_len, one exchange has no whole turn to cut (data.sizes.truncation=turns):
    # dropped: its first 20 tokens, none supervised, its length before the cut recorded.
    dropped = chat_dataset[5]
    assert dropped["input_ids"].numel() == 20 and (dropped["labels"] == -100).all()
    assert dropped[TRUNCATED_FROM] > 20
    tail = ChatDataset(RECORDS, chat_dataset.template.tokenizer, 20, truncation="tail")
    assert tail[5]["input_ids"].numel() == 20 and tail[5][TRUNCATED_FROM] > 20


def test_chat_dataset_pickles_for_spawn_workers(chat_dataset: ChatDataset) -> None:
    clone = pickle.loads(pickle.dumps(chat_dataset))
    for index in range(len(chat_dataset)):
        assert torch.equal(clone[index]["input_ids"], chat_dataset[index]["input_ids"])
        assert torch.equal(clone[index]["labels"], chat_dataset[index]["labels"])


@pytest.mark.slow
def test_chat_dataset_in_spawned_workers(chat_dataset: ChatDataset) -> None:
    loader = torch.utils.data.DataLoader(
        chat_dataset,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",
    )
    spawned = [sample["input_ids"].tolist() for sample in loader]
    assert spawned == [chat_dataset[i]["input_ids"].tolist() for i in range(len(chat_dataset))]


def test_chat_dataset_bad_record_names_index_and_field(tokenizer: QwenTokenizer) -> None:
    records = [*RECORDS[:2], {"id": "x", "messages": [{"role": "bot", "content": "?"}]}]
    dataset = ChatDataset(records, tokenizer, max_seq_len=64)
    with pytest.raises(BadSampleError) as info:
        dataset[2]
    assert (info.value.index, info.value.field) == (2, "messages[0].role")
    assert "sample 2" in str(info.value)
    with pytest.raises(BadSampleError, match="'messages'"):
        ChatDataset([{"id": 1}], tokenizer, max_seq_len=8)[0]


def test_tokenized_dataset() -> None:
    dataset = TokenizedDataset([([1, 2, 3], [-100, 2, 3]), ([4, 5], None)])
    assert dataset[0]["labels"].tolist() == [-100, 2, 3]
    assert dataset[1]["labels"].tolist() == [4, 5]
    assert inspect_sample(dataset[0], 0, 8) == SampleStats(3, 2)


def test_synthetic_dataset_is_deterministic_and_valid() -> None:
    dataset = SyntheticDataset.from_profile("sharegpt_mix", 50, max_seq_len=2048, seed=7)
    again = SyntheticDataset.from_profile("sharegpt_mix", 50, max_seq_len=2048, seed=7)
    for index in range(len(dataset)):
        sample = dataset[index]
        assert torch.equal(sample["input_ids"], again[index]["input_ids"])
        stats = inspect_sample(sample, index, max_seq_len=2048)
        length = dataset.lengths[index]
        prompt = max(1, int(length * 0.3))
        assert stats == SampleStats(length, length - prompt)
        assert (sample["labels"][:prompt] == IGNORE_INDEX).all()
        assert dataset.num_loss_tokens(index) == length - prompt


GOOD = {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([-100, 6, 7])}


def test_chat_dataset_marks_truncated_samples(
    chat_dataset: ChatDataset, tokenizer: QwenTokenizer
) -> None:
    full = ChatDataset(RECORDS, tokenizer, max_seq_len=4096)
    for index in range(len(chat_dataset)):
        sample, whole = chat_dataset[index], full[index]
        length, full_length = sample["input_ids"].numel(), whole["input_ids"].numel()
        assert is_truncated(sample, length) == (full_length > 20)
        assert sample.get(TRUNCATED_FROM, length) == full_length
        assert TRUNCATED_FROM not in whole and not is_truncated(whole, full_length)
    assert is_truncated(chat_dataset[5], 20)


def test_chat_dataset_finds_records_without_assistant_turn(tokenizer: QwenTokenizer) -> None:
    records = [
        *RECORDS[:2],
        {"id": "u", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "s", "messages": [{"role": "system", "content": "be brief"}]},
        {"id": "bad", "messages": None},
    ]
    dataset = ChatDataset(records, tokenizer, max_seq_len=64)
    assert dataset.unsupervised_indices(range(5)) == [2, 3, 4]
    assert dataset.unsupervised_indices([0, 1, 3]) == [3]
