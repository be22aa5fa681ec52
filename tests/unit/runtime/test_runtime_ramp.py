"""The window ramp in ``ODBLoader`` (``num_workers=0``): the steps equal the simulator's
with the ramp on, the first batch comes after the ramp's samples only, and a resumed epoch
ramps again and stays exact."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.simulate import simulate_dealt_epoch, simulate_epoch
from odb_lightning.runtime import ODBLoader

RAMP = {"token_budget": 800, "window_budgets": 32, "ramp_budgets": 2, "seed": 3}


class CountingDataset:
    """Sample ``i`` has ``lengths[i]`` tokens, half of them supervised; counts fetches."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.fetched.append(index)
        input_ids = torch.arange(self.lengths[index])
        labels = input_ids.clone()
        labels[: self.lengths[index] // 2] = -100
        return {"input_ids": input_ids, "labels": labels}

    def num_loss_tokens(self, index: int) -> int:
        return self.lengths[index] - max(1, self.lengths[index] // 2)

    def fetched_tokens(self) -> int:
        return sum(self.lengths[i] for i in self.fetched)


def _dataset(n: int = 600) -> CountingDataset:
    generator = torch.Generator().manual_seed(1)
    return CountingDataset(torch.randint(2, 400, (n,), generator=generator).tolist())


def _expected(dataset: CountingDataset, config: BatchingConfig, epoch: int):
    """The simulator's steps for one rank, as dataset indices, and the result."""
    order = epoch_permutation(len(dataset), config.seed, epoch)
    lengths = [dataset.lengths[i] for i in order]
    losses = [dataset.num_loss_tokens(i) for i in order]
    if config.policy.by_need:
        result = simulate_dealt_epoch(lengths, 1, config, loss_tokens=losses, epoch=epoch)
    else:
        result = simulate_epoch([lengths], config, loss_tokens=[losses], epoch=epoch)
    steps = [[order[s.sample_id] for s in step.group.samples] for step in result.steps[0]]
    return steps, result


@pytest.mark.parametrize("dealing", ["fixed", "by_need"])
def test_ramped_loader_matches_simulation_and_starts_after_the_ramp(dealing: str) -> None:
    dataset = _dataset()
    with ODBLoader(dataset, num_workers=0, shard_dealing=dealing, **RAMP) as loader:
        loader.set_epoch(1)
        batches = iter(loader)
        first = next(batches)
        fetched_before_first = len(dataset.fetched)
        tokens_before_first = dataset.fetched_tokens()
        emitted = [first, *batches]
    config = BatchingConfig.of(shard_dealing=dealing, **RAMP)
    expected, result = _expected(dataset, config, epoch=1)
    assert [list(b.meta.sample_ids) for b in emitted] == expected
    # The first batch came once the window held 2 budgets (the simulator's count exactly),
    # not the 32 of the full window.
    assert fetched_before_first == result.first_step_samples[0]
    assert 2 * 800 <= tokens_before_first < 3 * 800
    rounds = Counter(b.meta.round_index for b in emitted)
    per_round = [rounds[r] for r in sorted(rounds)]
    assert per_round[0] <= 4 < 16 <= max(per_round), "a small first round, then full ones"
    without = BatchingConfig.of(config, ramp_budgets=None)
    assert _expected(dataset, without, epoch=1)[1].first_step_cost[0] >= 32 * 800


def test_a_resumed_epoch_ramps_again_and_emits_the_rest_once() -> None:
    dataset = _dataset()
    with ODBLoader(dataset, num_workers=0, **RAMP) as first:
        before = []
        for batch in first:
            before.append(batch)
            if len(before) == 30:  # past the ramp: full windows of 32 budgets
                break
        assert len({b.meta.round_index for b in before}) >= 3
        state = first.state_dict()
    dataset.fetched.clear()
    with ODBLoader(dataset, num_workers=0, **RAMP) as second:
        second.load_state_dict(state)
        batches = iter(second)
        resumed_first = next(batches)
        tokens_before_first = dataset.fetched_tokens()
        after = [resumed_first, *batches]
    assert 2 * 800 <= tokens_before_first < 3 * 800, "the resumed epoch ramps from 2 budgets"
    ids = [i for b in before + after for i in b.meta.sample_ids]
    assert Counter(ids) == Counter(range(len(dataset))), "every sample exactly once"
