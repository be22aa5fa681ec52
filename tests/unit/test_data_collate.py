"""pad_collate and pack_collate: shapes, values, and no target across a packed boundary."""

from __future__ import annotations

import pytest
import torch

from odb_lightning.data import IGNORE_INDEX, pack_collate, pad_collate, validate_sample


def sample(ids: list[int], labels: list[int] | None = None) -> dict[str, torch.Tensor]:
    out = {"input_ids": torch.tensor(ids)}
    if labels is not None:
        out["labels"] = torch.tensor(labels)
    return out


SAMPLES = [
    sample([11, 12, 13], [-100, 12, 13]),
    sample([21, 22, 23, 24, 25], [21, -100, 23, 24, 25]),
    sample([31], [31]),
]


def test_pad_collate() -> None:
    batch = pad_collate(SAMPLES, pad_id=0)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert all(t.shape == (3, 5) and t.dtype == torch.long for t in batch.values())
    assert batch["input_ids"].tolist() == [
        [11, 12, 13, 0, 0],
        [21, 22, 23, 24, 25],
        [31, 0, 0, 0, 0],
    ]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [
        [-100, 12, 13, -100, -100],
        [21, -100, 23, 24, 25],
        [31, -100, -100, -100, -100],
    ]


def test_pad_collate_without_labels_and_empty() -> None:
    batch = pad_collate([sample([1, 2]), sample([3])], pad_id=9)
    assert batch["labels"].tolist() == [[1, 2], [3, -100]]
    assert batch["input_ids"].tolist() == [[1, 2], [3, 9]]
    with pytest.raises(ValueError):
        pad_collate([], pad_id=0)


def test_pack_collate() -> None:
    batch = pack_collate(SAMPLES)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 23, 24, 25, 31]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 9]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["max_seqlen"] == 5
    # First label of every sample masked: position 2 (last of sample 0) must not learn 21.
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, -100, 23, 24, 25, -100]]
    for key in ("input_ids", "labels", "position_ids"):
        assert batch[key].shape == (1, 9) and batch[key].dtype == torch.long


def test_packing_keeps_the_supervised_token_count() -> None:
    batch = pack_collate(SAMPLES)
    per_sample = sum(validate_sample(s, i, 8).num_loss_tokens for i, s in enumerate(SAMPLES))
    assert int((batch["labels"][0, 1:] != IGNORE_INDEX).sum()) == per_sample == 5
    padded = pad_collate(SAMPLES, pad_id=0)
    assert int((padded["labels"][:, 1:] != IGNORE_INDEX).sum()) == per_sample


def test_pack_collate_single_and_empty() -> None:
    batch = pack_collate([sample([7, 8])])
    assert batch["cu_seqlens"].tolist() == [0, 2] and batch["labels"].tolist() == [[-100, 8]]
    with pytest.raises(ValueError):
        pack_collate([])
