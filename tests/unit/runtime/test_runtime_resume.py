"""Exact mid-epoch resume of the loaders: the samples emitted before a checkpoint plus
those emitted after it are the epoch, each exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from odb_lightning.core.order import epoch_permutation
from odb_lightning.runtime import ODBLoader
from odb_lightning.runtime.planned import PlannedLoader
from odb_lightning.runtime.resume import EpochProgress, ResumeStateError

LOADER = {
    "token_budget": 800,
    "outstanding_depth": 32,
    "window_budgets": None,
    "max_steps_per_round": 4,
    "seed": 3,
}


class LengthDataset:
    """Sample ``i`` has ``lengths[i]`` tokens; the first half is an unsupervised prompt."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        input_ids = torch.arange(self.lengths[index]) + index
        labels = input_ids.clone()
        labels[: self.lengths[index] // 2] = -100
        return {"input_ids": input_ids, "labels": labels}


def _dataset(n: int = 160) -> LengthDataset:
    generator = torch.Generator().manual_seed(0)
    return LengthDataset(torch.randint(2, 400, (n,), generator=generator).tolist())


def _ids(batches: list) -> list[int]:
    return [i for batch in batches for i in batch.meta.sample_ids]


def _take(loader, steps: int) -> list:
    taken = []
    for batch in loader:
        taken.append(batch)
        if len(taken) == steps:
            break
    return taken


def _fixed_plan(batch_size: int, n: int):
    def plan(epoch: int) -> list[list[int]]:
        order = epoch_permutation(n, 7, epoch)
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]

    return plan


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("epoch", [0, 2])
@pytest.mark.parametrize(
    "window",
    [
        {},
        {"window_budgets": 3, "shard_dealing": "by_need"},
        {"window_budgets": 3, "shard_dealing": "by_need", "emission_order": "paired"},
        {"window_budgets": 3, "shard_dealing": "by_need", "fetch_aware_dealing": True},
    ],
    ids=["samples", "work_by_need", "paired", "fetch_aware"],
)
def test_odb_resume_emits_the_rest_of_the_epoch_once(
    num_workers: int, epoch: int, window: dict
) -> None:
    dataset = _dataset()
    loader = {**LOADER, **window}
    with ODBLoader(dataset, num_workers=num_workers, **loader) as first:
        first.set_epoch(epoch)
        before = _take(first, 5)
        state = first.state_dict()
    # The window held samples that were read but never emitted: they are not consumed.
    assert state["epoch"] == epoch and len(state["consumed_ids"]) == len(_ids(before))
    with ODBLoader(dataset, num_workers=num_workers, **loader) as second:
        second.load_state_dict(state)
        assert second.epoch == epoch
        after = list(second)
    emitted = Counter(_ids(before) + _ids(after))
    assert sorted(emitted) == list(range(len(dataset)))
    assert set(emitted.values()) == {1}


def test_odb_state_of_a_finished_epoch_is_the_next_epoch() -> None:
    dataset = _dataset(60)
    with ODBLoader(dataset, num_workers=0, **LOADER) as loader:
        loader.set_epoch(4)
        list(loader)
        assert loader.state_dict() == EpochProgress(5).to_state()
        loader.load_state_dict(loader.state_dict())
        assert len(_ids(list(loader))) == 60, "the next epoch runs in full"


def test_consumed_steps_counts_only_what_the_caller_consumed() -> None:
    """A trainer that fetched one batch ahead saves only the batches it trained on."""
    dataset = _dataset()
    with ODBLoader(dataset, num_workers=0, **LOADER) as first:
        fetched = _take(first, 4)
        state = first.state_dict(consumed_steps=3)
        with pytest.raises(ValueError, match=r"consumed_steps must be in \[0, 4\]"):
            first.state_dict(consumed_steps=5)
    assert sorted(state["consumed_ids"]) == sorted(_ids(fetched[:3]))
    with ODBLoader(dataset, num_workers=0, **LOADER) as second:
        second.load_state_dict(state)
        after = list(second)
    assert Counter(_ids(fetched[:3]) + _ids(after)) == Counter(range(len(dataset)))


def test_state_from_more_ranks_is_resharded() -> None:
    """The consumed set is job-wide: a state from a 2-rank job (both ranks' ids) resumes
    on one rank with exactly the samples neither rank emitted."""
    dataset = _dataset(120)
    consumed = set(epoch_permutation(120, 1, 0)[:50])
    state = EpochProgress(0, frozenset(consumed)).to_state()
    with ODBLoader(dataset, num_workers=0, **LOADER) as loader:
        loader.load_state_dict(state)
        after = _ids(list(loader))
    assert sorted(after) == sorted(set(range(120)) - consumed)


def test_loaded_state_resumes_one_iteration_only() -> None:
    dataset = _dataset(80)
    state = EpochProgress(0, frozenset(range(40))).to_state()
    with ODBLoader(dataset, num_workers=0, **LOADER) as loader:
        loader.load_state_dict(state)
        assert sorted(_ids(list(loader))) == list(range(40, 80))
        assert len(_ids(list(loader))) == 80, "iterating epoch 0 again runs all of it"


@pytest.mark.parametrize("world_size", [1, 2])
def test_planned_resume_continues_with_the_next_batch(world_size: int) -> None:
    dataset = _dataset(100)
    plan = _fixed_plan(6, 100)

    def loaders() -> list[PlannedLoader]:
        return [
            PlannedLoader(dataset, plan, world_size=world_size, rank=r, num_workers=0)
            for r in range(world_size)
        ]

    uninterrupted = [[b.meta.sample_ids for b in loader] for loader in loaders()]
    first = loaders()
    for loader in first:
        loader.set_epoch(0)
    before = [_take(loader, 3) for loader in first]
    states = [loader.state_dict() for loader in first]
    assert all(s == states[0] for s in states), "every rank knows the whole plan"
    after = []
    for loader in loaders():
        loader.load_state_dict(states[0])
        after.append([b.meta.sample_ids for b in loader])
    for rank in range(world_size):
        resumed = [b.meta.sample_ids for b in before[rank]] + after[rank]
        assert resumed == uninterrupted[rank], "the same batches as without the stop"


def test_planned_resume_on_fewer_ranks_covers_the_epoch_once() -> None:
    dataset = _dataset(100)
    plan = _fixed_plan(5, 100)
    two = [PlannedLoader(dataset, plan, world_size=2, rank=r, num_workers=0) for r in range(2)]
    before = [_take(loader, 4) for loader in two]
    state = two[0].state_dict()
    one = PlannedLoader(dataset, plan, world_size=1, rank=0, num_workers=0)
    one.load_state_dict(state)
    emitted = Counter(_ids(before[0]) + _ids(before[1]) + _ids(list(one)))
    assert emitted == Counter(range(100))


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"format": 9, "epoch": 0, "consumed_ids": []}, "'format' must be 1"),
        ({"format": 1, "epoch": -1, "consumed_ids": []}, "'epoch' must be an integer >= 0"),
        ({"format": 1, "epoch": 0, "consumed_ids": [3, 500]}, "not indices of this dataset"),
        ({"format": 1, "epoch": 0, "consumed_ids": [3, 3]}, "lists an id twice"),
        ({"format": 1, "epoch": 0, "consumed_ids": "12"}, "'consumed_ids' must be a list"),
    ],
)
def test_bad_states_are_refused_naming_the_field(state: dict, message: str) -> None:
    with (
        ODBLoader(_dataset(), num_workers=0, **LOADER) as loader,
        pytest.raises(ResumeStateError, match=message),
    ):
        loader.load_state_dict(state)


def test_state_cannot_be_loaded_into_a_started_epoch() -> None:
    for loader in (
        ODBLoader(_dataset(), num_workers=0, **LOADER),
        PlannedLoader(_dataset(100), _fixed_plan(6, 100), num_workers=0),
    ):
        _take(loader, 2)
        with pytest.raises(RuntimeError, match="before the loader's first iteration or between"):
            loader.load_state_dict(EpochProgress(0).to_state())
        loader.close()
