"""The patch budget inside the ODB window and the alignment: at 1 to 8 ranks every sample
is emitted once, every rank runs the same steps, and no group of several samples exceeds
the token budget or the patch budget; a sample whose patches alone exceed it is emitted
alone and counted."""

from __future__ import annotations

import random

import pytest

from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import greedy_cuts, group_window, sort_longest_first
from odb_lightning.core.patch_budget import PatchBudget
from odb_lightning.core.simulate import simulate_epoch
from odb_lightning.core.types import SampleInfo


def shards(world_size: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    lengths = [[rng.randint(2, 400) for _ in range(rng.randint(20, 90))] for _ in range(world_size)]
    # A fifth text-only; a few huge images (over the patch budget on their own).
    patches = [
        [0 if rng.random() < 0.2 else rng.choice([rng.randint(4, 600), 5000]) for _ in shard]
        for shard in lengths
    ]
    return lengths, patches


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("packed", [False, True])
def test_window_groups_within_both_budgets_exactly_once(world_size: int, packed: bool) -> None:
    for seed in range(4):
        lengths, patches = shards(world_size, seed + 10 * world_size)
        config = BatchingConfig.of(
            mode="odb_packed" if packed else "odb",
            token_budget=1200,
            max_patches=1500,
            outstanding_depth=48,
            max_steps_per_round=4,
        )
        result = simulate_epoch(lengths, config, patches=patches)
        assert len({len(rank) for rank in result.steps}) == 1  # equal steps
        budget = config.budget
        for rank, rank_steps in enumerate(result.steps):
            emitted = [s.sample_id for step in rank_steps if step.group for s in step.group.samples]
            assert sorted(emitted) == list(range(len(lengths[rank])))  # exactly once
            alone = 0
            for step in rank_steps:
                if step.group is None:
                    continue
                members = step.group.samples
                group_patches = sum(patches[rank][s.sample_id] for s in members)
                if len(members) == 1:
                    alone += group_patches > 1500
                    continue
                assert group_patches <= 1500
                if packed:
                    total = sum(s.length for s in members)
                    squares = sum(s.length**2 for s in members)
                    assert budget.packed_cost(total, squares) <= 1200
                else:
                    assert budget.fits(len(members), max(s.length for s in members))
            assert result.over_patch_budget[rank] == alone
        assert sum(result.over_patch_budget) > 0  # the 5,000-patch images


def test_window_grouping_agrees_with_the_pure_rule() -> None:
    rng = random.Random(3)
    samples = [
        SampleInfo(i, rng.randint(2, 300), position=i, num_patches=rng.randint(0, 400))
        for i in range(200)
    ]
    budget, patch_budget = Budget(2048), PatchBudget(900)
    groups = group_window(samples, budget, patch_budget=patch_budget)
    ordered = sort_longest_first(samples)
    starts = greedy_cuts(ordered, budget, patch_budget=patch_budget)
    ends = (*starts[1:], len(ordered))
    assert [b - a for a, b in zip(starts, ends, strict=True)] == [g.size for g in groups]
    assert [s for g in groups for s in g.samples] == ordered
    # Without the patch budget the same window needs fewer groups: the bound binds.
    assert len(group_window(samples, budget)) < len(groups)
