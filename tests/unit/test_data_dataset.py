"""Datasets return 1-D long samples; validate_sample names index and field; pickling."""

from __future__ import annotations

import pickle
import statistics

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
    lognormal_lengths,
    validate_sample,
)

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
def chat_dataset() -> ChatDataset:
    return ChatDataset(RECORDS, QwenTokenizer(), max_seq_len=20)


def test_chat_dataset_items(chat_dataset: ChatDataset) -> None:
    assert len(chat_dataset) == 6 and chat_dataset.record_id(2) == "r2"
    for index in range(len(chat_dataset)):
        sample = chat_dataset[index]
        assert set(sample) == {"input_ids", "labels"}
        assert sample["input_ids"].dtype == torch.long and sample["input_ids"].dim() == 1
        assert sample["labels"].shape == sample["input_ids"].shape
        stats = validate_sample(sample, index, max_seq_len=20)
        assert stats.length == sample["input_ids"].numel() <= 20
    assert chat_dataset[0]["input_ids"].numel() < 20
    assert chat_dataset[5]["input_ids"].numel() == 20  # right-truncated


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


def test_chat_dataset_bad_record_names_index_and_field() -> None:
    records = [*RECORDS[:2], {"id": "x", "messages": [{"role": "bot", "content": "?"}]}]
    dataset = ChatDataset(records, QwenTokenizer(), max_seq_len=64)
    with pytest.raises(BadSampleError) as info:
        dataset[2]
    assert (info.value.index, info.value.field) == (2, "messages[0].role")
    assert "dataset index 2" in str(info.value)
    with pytest.raises(BadSampleError, match="'messages'"):
        ChatDataset([{"id": 1}], QwenTokenizer(), max_seq_len=8)[0]


def test_tokenized_dataset() -> None:
    dataset = TokenizedDataset([([1, 2, 3], [-100, 2, 3]), ([4, 5], None)])
    assert dataset[0]["labels"].tolist() == [-100, 2, 3]
    assert dataset[1]["labels"].tolist() == [4, 5]
    assert validate_sample(dataset[0], 0, 8) == SampleStats(3, 2)


def test_lognormal_lengths_hit_mean_and_cv() -> None:
    lengths = lognormal_lengths(50_000, 977.0, 0.82, seed=1)
    mean = statistics.fmean(lengths)
    assert mean == pytest.approx(977.0, rel=0.02)
    assert statistics.pstdev(lengths) / mean == pytest.approx(0.82, rel=0.05)
    assert lengths == lognormal_lengths(50_000, 977.0, 0.82, seed=1)
    assert max(lognormal_lengths(1000, 977.0, 0.82, max_length=512)) == 512


def test_synthetic_dataset_is_deterministic_and_valid() -> None:
    dataset = SyntheticDataset.from_profile("sharegpt_mix", 50, max_seq_len=2048, seed=7)
    again = SyntheticDataset.from_profile("sharegpt_mix", 50, max_seq_len=2048, seed=7)
    for index in range(len(dataset)):
        sample = dataset[index]
        assert torch.equal(sample["input_ids"], again[index]["input_ids"])
        stats = validate_sample(sample, index, max_seq_len=2048)
        length = dataset.lengths[index]
        prompt = max(1, int(length * 0.3))
        assert stats == SampleStats(length, length - prompt)
        assert (sample["labels"][:prompt] == IGNORE_INDEX).all()


GOOD = {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([-100, 6, 7])}


@pytest.mark.parametrize(
    ("sample", "field", "problem"),
    [
        ([1, 2, 3], "<sample>", "must be a dict"),
        ({"labels": GOOD["labels"]}, "input_ids", "missing"),
        ({"input_ids": [1, 2]}, "input_ids", "torch.Tensor"),
        ({"input_ids": torch.tensor([], dtype=torch.long)}, "input_ids", "empty"),
        ({"input_ids": torch.tensor([1.0, 2.0])}, "input_ids", "integer dtype"),
        ({"input_ids": torch.tensor([True, False])}, "input_ids", "integer dtype"),
        ({"input_ids": torch.ones(2, 3, dtype=torch.long)}, "input_ids", "1-D"),
        ({"input_ids": torch.arange(9)}, "input_ids", "length 9 > max_seq_len 8"),
        ({"input_ids": torch.tensor([3, -1])}, "input_ids", "negative"),
        ({"input_ids": GOOD["input_ids"], "labels": torch.tensor([1, 2])}, "labels", "shape"),
        ({"input_ids": GOOD["input_ids"], "labels": torch.zeros(3)}, "labels", "integer"),
    ],
)
def test_validate_sample_errors_name_index_and_field(sample, field: str, problem: str) -> None:
    with pytest.raises(BadSampleError) as info:
        validate_sample(sample, 41, max_seq_len=8)
    assert (info.value.index, info.value.field) == (41, field)
    message = str(info.value)
    assert "dataset index 41" in message and repr(field) in message and problem in message
    assert isinstance(info.value, ValueError)


def test_validate_sample_counts_shifted_loss_tokens() -> None:
    assert validate_sample(GOOD, 0, 8) == SampleStats(3, 2)
    no_labels = {"input_ids": torch.tensor([1, 2, 3, 4], dtype=torch.int32)}
    assert validate_sample(no_labels, 0, 8) == SampleStats(4, 3)
    first_only = {"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([1, -100])}
    assert validate_sample(first_only, 0, 8) == SampleStats(2, 0)
