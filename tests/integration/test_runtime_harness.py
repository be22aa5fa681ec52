"""The multi-rank harness's own contract (:mod:`testing.harness`): the shards it
deals and the supervised-token counts it predicts, which the runtime tests compare the
loader against."""

from __future__ import annotations

import torch

from testing.harness.datasets import IGNORE, SkewedShard, SyntheticChatDataset


def test_skewed_shards_partition_the_dataset_by_weight_longest_first() -> None:
    lengths = tuple(SyntheticChatDataset.seeded(400).lengths)
    weights = (1, 3)
    shards = [SkewedShard(lengths, weights, rank)(epoch=0) for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(400))  # every sample, once
    assert [len(s) for s in shards] == [100, 300]
    assert min(lengths[i] for i in shards[0]) >= max(lengths[i] for i in shards[1])
    again, later = SkewedShard(lengths, weights, 1)(epoch=0), SkewedShard(lengths, weights, 1)(1)
    assert again == shards[1]  # seeded per epoch
    assert later != shards[1] and sorted(later) == sorted(shards[1])


def test_synthetic_samples_count_their_supervised_tokens() -> None:
    dataset = SyntheticChatDataset([2, 3, 7, 299])
    for index in range(len(dataset)):
        sample = dataset[index]
        assert len(sample["input_ids"]) == dataset.lengths[index]
        shifted = int((sample["labels"][1:] != IGNORE).sum())
        assert shifted == dataset.num_loss_tokens(index)
    bad = SyntheticChatDataset([5], bad_indices=frozenset({0}))[0]
    assert bad["input_ids"].shape == (0,) and bad["input_ids"].dtype == torch.long
