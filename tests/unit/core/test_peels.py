"""Split/overflow peels: which group each peel takes from, the figures a report carries
for them, and that a round whose step cap reaches its window costs work linear in it."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pytest

from odb_lightning.core.alignment import AlignmentError, peel_figures, peel_order, plan_round
from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import PackedBudget
from odb_lightning.core.sync import group_cost
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.core.window import GroupingWindow


def largest_first(sizes: list[int], num_peels: int) -> list[int]:
    """The rule, written as it reads: the largest group with more than one sample, the
    earliest on ties."""
    remaining, order = list(sizes), []
    for _ in range(num_peels):
        largest = max(range(len(remaining)), key=lambda i: (remaining[i], -i))
        assert remaining[largest] > 1
        remaining[largest] -= 1
        order.append(largest)
    return order


def test_peel_order_is_the_largest_group_first_rule() -> None:
    rng = random.Random(0)
    for _ in range(500):
        sizes = [rng.randint(1, 7) for _ in range(rng.randint(1, 25))]
        num_peels = rng.randint(0, sum(size - 1 for size in sizes))
        assert peel_order(sizes, num_peels) == largest_first(sizes, num_peels)
    with pytest.raises(AlignmentError, match="cannot split"):
        peel_order([2, 1, 3], 4)


def full_window(samples: int, *, rank: int = 0, length: int | None = None) -> GroupingWindow:
    """One rank holding ``samples`` samples, its step cap the window: of 16 to 2,048
    tokens under a 16,384-token budget, or each of ``length`` tokens."""
    config = BatchingConfig.of(
        token_budget=16384,
        outstanding_depth=samples,
        window_budgets=None,
        ramp_budgets=None,
        max_steps_per_round=samples,
        shard_dealing="fixed",
    )
    window = GroupingWindow(config, samples, rank=rank)
    rng = random.Random(0)
    for position in window.request():
        drawn = length or min(2048, max(16, int(rng.lognormvariate(5.5, 1.0))))
        window.add(SampleInfo(position, drawn, drawn // 2, position))
    return window


@pytest.mark.parametrize(
    "budget",
    [Budget(16384, 0.001, 8), PackedBudget(16384, 0.002), PackedBudget(16384, 0.002, 1, True)],
    ids=["padded", "packed", "packed_dense"],
)
def test_peel_figures_are_the_costs_of_what_each_peel_leaves(budget: Budget) -> None:
    window = full_window(400)
    window.make_report()
    groups = window._groups
    num_peels = 400 - len(groups)
    figures = peel_figures(groups, num_peels, budget)
    # Recomputed peel by peel from the groups themselves.
    members = [list(g.samples) for g in groups]

    def cost(samples: Sequence[SampleInfo]) -> int:
        return math.ceil(group_cost(Group(tuple(samples)), budget))

    expected = []
    for index in largest_first([len(m) for m in members], num_peels):
        before = cost(members[index])
        peeled = members[index].pop()
        expected.append((peeled.num_loss_tokens, cost([peeled]), before - cost(members[index])))
    assert figures == expected


@dataclass(frozen=True, slots=True)
class CountingBudget(Budget):
    """A padded budget that counts the sample lengths its costs read."""

    lengths_read: ClassVar[list[int]] = [0]

    def group_cost(self, lengths: Sequence[int]) -> float:
        self.lengths_read[0] += len(lengths)
        return Budget.group_cost(self, lengths)

    def aggregate_cost(self, size: int, longest: int, total: int, sum_of_squares: int) -> float:
        self.lengths_read[0] += 1
        return Budget.aggregate_cost(self, size, longest, total, sum_of_squares)


def test_a_round_capped_at_its_window_peels_it_whole_with_linear_work() -> None:
    """Rank 1's 8,192 long samples are 8,192 steps, so rank 0 splits its 8,192 short
    ones (about 200 groups) into 8,192 steps of one: the cap is the window."""
    samples = 8192
    short, long = full_window(samples), full_window(samples, rank=1, length=16000)
    CountingBudget.lengths_read[0] = 0
    short._budget = CountingBudget(16384)  # the report's peel figures count their work
    reports = [short.make_report(), long.make_report()]
    # Each peeled group's prefixes are costed once (one read per sample), each peel's
    # singleton once, each reported group once: a few reads per sample. Costing a group
    # anew on every peel read 92 per sample here.
    assert CountingBudget.lengths_read[0] <= 3 * samples
    assert reports[0].num_groups < samples // 20  # most samples come out of a peel
    outcome = short.apply(plan_round(reports, join=True))
    assert len(outcome.steps) == samples
    assert all(step.group.size == 1 for step in outcome.steps)
    emitted = [m.sample_id for step in outcome.steps for m in step.group.samples]
    assert sorted(emitted) == list(range(samples))  # every sample once
