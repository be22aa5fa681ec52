"""The patch budget: fewest groups of adjacent samples within the token and patch budgets
(``greedy_cuts``, what the window runs when ``batching.rows.max_patches`` is set)."""

from __future__ import annotations

import functools
import random

import pytest

from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import greedy_cuts
from odb_lightning.core.patch_budget import PatchBudget
from odb_lightning.core.types import SampleInfo


def group_ends(lengths, patches, budget, patch_budget=None, squares=None) -> tuple[int, ...]:
    """The end (exclusive) of each group ``greedy_cuts`` makes of a window given longest
    first, from each sample's length, patches and summed patch squares."""
    squares = squares or [0] * len(lengths)
    ordered = [
        SampleInfo(i, n, position=i, num_patches=p, patch_square_sum=q)
        for i, (n, p, q) in enumerate(zip(lengths, patches, squares, strict=True))
    ]
    starts = greedy_cuts(ordered, budget, patch_budget=patch_budget)
    return (*starts[1:], len(ordered))


def image_cost(images: tuple[int, ...], budget: PatchBudget) -> float:
    """The patch cost of one sample from its images, written out: ``sum(p + w p^2)``."""
    return sum(p + budget.patch_attention_weight * p * p for p in images)


def fewest_groups(lengths, images, budget: Budget, patch_budget: PatchBudget) -> int:
    """Reference: the minimum number of groups of adjacent samples by dynamic programming
    over every cut, where a group is allowed when it fits both budgets or is one sample."""

    def allowed(start: int, end: int) -> bool:
        if end - start == 1:
            return True
        cost = sum(image_cost(images[i], patch_budget) for i in range(start, end))
        return budget.fits(end - start, lengths[start]) and cost <= patch_budget.max_patches

    @functools.cache
    def best(start: int) -> int:
        if start == len(lengths):
            return 0
        return min(
            1 + best(end) for end in range(start + 1, len(lengths) + 1) if allowed(start, end)
        )

    return best(0)


def random_window(rng: random.Random, size: int):
    """Lengths longest first and, per sample, the patch counts of its 0-2 images."""
    lengths = sorted((rng.randint(1, 600) for _ in range(size)), reverse=True)
    images = [
        tuple(rng.choice((16, 64, 256, 1024, 3000)) for _ in range(rng.choice((0, 0, 1, 2))))
        for _ in range(size)
    ]
    return lengths, images


def totals(images):
    """What a sample's observed info carries: patches and their squares, summed."""
    return [sum(i) for i in images], [sum(p * p for p in i) for i in images]


@pytest.mark.parametrize("weight", [0.0, 1e-3])
def test_cuts_are_within_both_budgets_and_fewest(weight: float) -> None:
    rng = random.Random(0)
    budget = Budget(2048)
    patch_budget = PatchBudget(max_patches=2500, patch_attention_weight=weight)
    for _ in range(200):
        lengths, images = random_window(rng, rng.randint(1, 14))
        patches, squares = totals(images)
        ends = group_ends(lengths, patches, budget, patch_budget, squares)
        groups = [range(a, b) for a, b in zip((0, *ends[:-1]), ends, strict=True)]
        assert [i for g in groups for i in g] == list(range(len(lengths)))  # each once
        for group in groups:
            cost = sum(image_cost(images[i], patch_budget) for i in group)
            if len(group) > 1:
                assert budget.fits(len(group), lengths[group.start])
                assert cost <= patch_budget.max_patches
        assert len(groups) == fewest_groups(lengths, images, budget, patch_budget)


def test_the_patch_budget_splits_what_the_token_budget_allows() -> None:
    lengths = [300, 290, 280, 270]
    patches, squares = totals([(1000,), (1000,), (), (1000,)])
    tokens_only = group_ends(lengths, patches, Budget(4096))
    assert tokens_only == (4,)
    both = group_ends(lengths, patches, Budget(4096), PatchBudget(max_patches=2000))
    assert both == (3, 4)  # 1000 + 1000 + 0, then the last image
    quadratic = group_ends(lengths, patches, Budget(4096), PatchBudget(2000, 1e-3), squares)
    assert quadratic == (1, 3, 4)  # each image now costs 1000 + 1000
    over = group_ends([100, 90], [5000, 10], Budget(4096), PatchBudget(2000))
    assert over == (1, 2)  # the 5,000-patch sample alone


def test_bad_windows_and_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_patches"):
        PatchBudget(0)
    with pytest.raises(ValueError, match="patch_attention_weight"):
        PatchBudget(10, -1.0)
    assert BatchingConfig.of().patch_budget is None
    assert BatchingConfig.of(
        max_patches=64, patch_attention_weight=0.5
    ).patch_budget == PatchBudget(64, 0.5)
    for bad in ({"max_patches": 0}, {"max_patches": 2.5}, {"patch_attention_weight": float("inf")}):
        with pytest.raises(
            ValueError, match=r"batching\.rows\.(max_patches|patch_attention_weight)"
        ):
            BatchingConfig.of(**bad)
