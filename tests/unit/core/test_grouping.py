"""Window grouping: fewest groups, then least padding; checked against every possible cut."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb_lightning.core.budget import Budget
from odb_lightning.core.grouping import group_lengths, group_window, padded_cuts
from odb_lightning.core.rows import PackedBudget
from odb_lightning.core.types import SampleInfo

SMALL = st.lists(st.integers(1, 40), min_size=1, max_size=10)
CAPS = st.none() | st.integers(1, 4)


def _capacity(length: int, budget: Budget, cap: int | None) -> int:
    size = budget.max_group_size(length)
    return size if cap is None else min(size, cap)


def _cost(ordered: list[int], bounds: list[int], budget: Budget) -> float:
    return sum((b - a) * budget.row_cost(ordered[a]) for a, b in itertools.pairwise(bounds))


def _optimal_cuts(ordered: list[int], budget: Budget, cap: int | None):
    """Every contiguous cut (of all 2^(n-1)) with the fewest groups and the least cost."""
    n, cuts = len(ordered), []
    for inner in itertools.product((False, True), repeat=n - 1):
        bounds = [0, *(k + 1 for k, cut in enumerate(inner) if cut), n]
        if all(b - a <= _capacity(ordered[a], budget, cap) for a, b in itertools.pairwise(bounds)):
            cuts.append((len(bounds) - 1, _cost(ordered, bounds, budget), bounds))
    fewest = min(groups for groups, _, _ in cuts)
    least = min(cost for groups, cost, _ in cuts if groups == fewest)
    # Float costs (attention_weight > 0) are summed in another order than the DP sums them.
    close = least * 1e-12
    return fewest, least, [b for g, c, b in cuts if g == fewest and c <= least + close]


def _greedy_bounds(ordered: list[int], budget: Budget, cap: int | None) -> list[int]:
    """The plain rule: every group takes as many samples as its longest allows."""
    bounds = [0]
    while bounds[-1] < len(ordered):
        bounds.append(min(len(ordered), bounds[-1] + _capacity(ordered[bounds[-1]], budget, cap)))
    return bounds


def _samples(lengths: list[int]) -> list[SampleInfo]:
    return [SampleInfo(sample_id=i, length=n, position=i) for i, n in enumerate(lengths)]


@settings(max_examples=300, deadline=None)
@given(lengths=SMALL, budget=st.integers(1, 80), cap=CAPS, weight=st.sampled_from([0.0, 0.01]))
def test_padded_cut_is_the_optimum_over_every_cut(lengths, budget, cap, weight):
    plan = Budget(budget, weight)
    ordered = sorted(lengths, reverse=True)
    bounds = [*padded_cuts(_samples(ordered), plan, cap), len(ordered)]
    assert all(b - a <= _capacity(ordered[a], plan, cap) for a, b in itertools.pairwise(bounds))
    fewest, least, optimal = _optimal_cuts(ordered, plan, cap)
    assert len(bounds) - 1 == fewest
    assert _cost(ordered, bounds, plan) == pytest.approx(least, rel=1e-12, abs=1e-12)
    if weight == 0.0:  # integer costs: exact ties, broken towards the larger first group
        assert bounds == max(optimal)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4000), min_size=1, max_size=400),
    budget=st.integers(1, 20000),
    cap=st.none() | st.integers(1, 64),
)
def test_never_more_groups_or_padding_than_the_plain_rule(lengths, budget, cap):
    plan = Budget(budget)
    groups = group_window(_samples(lengths), plan, max_group_size=cap)
    members = [s.sample_id for g in groups for s in g.samples]
    assert sorted(members) == list(range(len(lengths)))  # every sample exactly once
    assert [s.length for g in groups for s in g.samples] == sorted(lengths, reverse=True)
    for group in groups:
        assert group.size == 1 or group.num_padded_tokens <= budget
        assert cap is None or group.size <= cap
    greedy = _greedy_bounds(sorted(lengths, reverse=True), plan, cap)
    assert len(groups) == len(greedy) - 1
    padded = sum(g.num_padded_tokens for g in groups)
    assert padded <= _cost(sorted(lengths, reverse=True), greedy, plan)


def test_the_slack_goes_where_it_saves_padding():
    # Budget 120: the plain rule cuts [60, 45] [30, 30, 10, 10] [10, 10, 10], i.e.
    # 120 + 120 + 30 = 270 padded tokens. Three groups are the fewest either way; leaving
    # the 10s out of the 30s' group pads them to 10 instead of 30: 120 + 60 + 50 = 230.
    lengths = [60, 45, 30, 30, 10, 10, 10, 10, 10]
    groups = group_lengths(lengths, Budget(120))
    assert [[lengths[i] for i in g] for g in groups] == [[60, 45], [30, 30], [10] * 5]


def test_packed_groups_fill_the_real_token_budget_in_order():
    lengths = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert group_lengths(lengths, PackedBudget(20)) == [[0, 1], [2, 3], [4, 5, 6, 7, 8], [9]]
    assert group_lengths(lengths, PackedBudget(20), max_group_size=3)[2] == [4, 5, 6]


def test_ties_go_to_the_larger_first_group():
    # Budget 144: capacity 3 at 40, 4 at 30, 14 at 10. Three groups either way; [40 x 3]
    # [40, 40, 30] ... and [40 x 2] [40 x 3] ... cost the same, the larger first group wins.
    lengths = [40] * 5 + [30] * 4 + [10] * 2
    bounds = padded_cuts(_samples(lengths), Budget(144))
    assert bounds == [0, 3, 5, 9]


def test_ties_in_a_long_window_of_one_length_go_to_the_first_group():
    # 20,000 equal short samples: every cut ties; the run-by-run divide and conquer keeps
    # this at O(n log n) (a plain scan of every tie is quadratic: seconds).
    groups = group_lengths([6] * 20_000, Budget(65536))
    assert [len(g) for g in groups] == [10922, 9078]


def test_over_budget_samples_go_alone_and_ties_follow_arrival():
    groups = group_window(_samples([50, 7, 50, 7]), Budget(20))
    assert [[s.sample_id for s in g.samples] for g in groups] == [[0], [2], [1, 3]]
    assert group_window([], Budget(20)) == []
