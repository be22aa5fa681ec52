"""The patch budget: fewest groups of adjacent samples within the token and patch budgets."""

from __future__ import annotations

import functools
import random

import pytest

from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.patch_budget import PatchBudget, cut_groups


def fewest_groups(lengths, patches, budget: Budget, patch_budget: PatchBudget | None) -> int:
    """Reference: the minimum number of groups of adjacent samples by dynamic programming
    over every cut, where a group is allowed when it fits both budgets or is one sample."""

    def allowed(start: int, end: int) -> bool:
        if end - start == 1:
            return True
        cost = sum(patch_budget.sample_cost(p) for p in patches[start:end]) if patch_budget else 0
        fits_patches = patch_budget is None or cost <= patch_budget.max_patches
        return budget.fits(end - start, lengths[start]) and fits_patches

    @functools.cache
    def best(start: int) -> int:
        if start == len(lengths):
            return 0
        return min(
            1 + best(end) for end in range(start + 1, len(lengths) + 1) if allowed(start, end)
        )

    return best(0)


def random_window(rng: random.Random, size: int):
    lengths = sorted((rng.randint(1, 600) for _ in range(size)), reverse=True)
    patches = [
        tuple(rng.choice((16, 64, 256, 1024, 3000)) for _ in range(rng.choice((0, 0, 1, 2))))
        for _ in range(size)
    ]
    return lengths, patches


@pytest.mark.parametrize("weight", [0.0, 1e-3])
def test_cuts_are_within_both_budgets_and_fewest(weight: float) -> None:
    rng = random.Random(0)
    budget = Budget(2048)
    patch_budget = PatchBudget(max_patches=2500, patch_attention_weight=weight)
    for _ in range(200):
        lengths, patches = random_window(rng, rng.randint(1, 14))
        cuts = cut_groups(lengths, patches, budget, patch_budget)
        groups = cuts.groups()
        assert [i for g in groups for i in g] == list(range(len(lengths)))  # each once
        over_tokens = over_patches = 0
        for group in groups:
            cost = sum(patch_budget.sample_cost(patches[i]) for i in group)
            if len(group) > 1:
                assert budget.fits(len(group), lengths[group.start])
                assert cost <= patch_budget.max_patches
            else:
                over_tokens += budget.is_over_budget(lengths[group.start])
                over_patches += cost > patch_budget.max_patches
        assert (cuts.over_token_budget, cuts.over_patch_budget) == (over_tokens, over_patches)
        assert len(groups) == fewest_groups(lengths, patches, budget, patch_budget)


def test_the_patch_budget_splits_what_the_token_budget_allows() -> None:
    lengths = [300, 290, 280, 270]
    patches = [(1000,), (1000,), (), (1000,)]
    tokens_only = cut_groups(lengths, patches, Budget(4096))
    assert tokens_only.ends == (4,)
    both = cut_groups(lengths, patches, Budget(4096), PatchBudget(max_patches=2000))
    assert both.ends == (3, 4)  # 1000 + 1000 + 0, then the last image
    quadratic = cut_groups(lengths, patches, Budget(4096), PatchBudget(2000, 1e-3))
    assert quadratic.ends == (1, 3, 4)  # each image now costs 1000 + 1000
    over = cut_groups([100, 90], [(5000,), (10,)], Budget(4096), PatchBudget(2000))
    assert over.ends == (1, 2) and over.over_patch_budget == 1 and over.over_token_budget == 0


def test_bad_windows_and_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="sorted longest first"):
        cut_groups([10, 20], [(), ()], Budget(100))
    with pytest.raises(ValueError, match="2 lengths but 1"):
        cut_groups([20, 10], [()], Budget(100))
    with pytest.raises(ValueError, match="max_patches"):
        PatchBudget(0)
    with pytest.raises(ValueError, match="patch_attention_weight"):
        PatchBudget(10, -1.0)
    assert BatchingConfig().patch_budget is None
    assert BatchingConfig(max_patches=64, patch_attention_weight=0.5).patch_budget == PatchBudget(
        64, 0.5
    )
    for bad in ({"max_patches": 0}, {"max_patches": 2.5}, {"patch_attention_weight": float("inf")}):
        with pytest.raises(ValueError, match=r"batching\.(max_patches|patch_attention_weight)"):
            BatchingConfig(**bad)
