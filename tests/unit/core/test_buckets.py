"""Bucket optimizer: exact order statistics, DP optimality, model vs the real packer."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb_lightning.core.buckets import (
    bucket_table,
    candidate_edges,
    expected_max,
    expected_padded_tokens,
    optimize_boundaries,
    predict_efficiency,
    simulate_bucketed,
)
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.plans import bucket_of
from odb_lightning.core.profiles import lognormal_lengths

SEED_BOUNDARIES = [0, 770, 1216, 1728, 2432, 3296, 8192]
LOGNORMAL = lognormal_lengths(5000, 1456, 0.54, seed=0, max_len=8191)
SEED_SETTINGS = {"token_budget": 49152, "max_batch_size": 64}


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.integers(1, 50), min_size=1, max_size=8), data=st.data())
def test_expected_max_equals_enumeration(values, data):
    b = data.draw(st.integers(1, len(values)))
    subsets = list(itertools.combinations(values, b))
    brute = sum(max(s) for s in subsets) / len(subsets)
    assert expected_max(values, b) == pytest.approx(brute, rel=1e-12)


def test_expected_max_large_population_is_exact_and_stable():
    # Draws of b from {1..m} without replacement: E[max] = b (m + 1) / (b + 1).
    m = 20000
    values = list(range(1, m + 1))
    for b in (1, 2, 11, 64, 500):
        assert expected_max(values, b) == pytest.approx(b * (m + 1) / (b + 1), rel=1e-9)
    assert expected_max([7] * 5000, 64) == pytest.approx(7.0, rel=1e-12)
    assert expected_max([3, 9], 5) == 9.0  # b beyond m takes everything


def test_candidate_edges_are_interior_quantile_lengths():
    lengths = lognormal_lengths(2000, 900, 0.7, seed=3)
    edges = candidate_edges(lengths, 32)
    assert edges == sorted(set(edges))
    assert set(edges) <= set(lengths)
    assert min(lengths) < edges[0] and edges[-1] <= max(lengths)
    assert 25 <= len(edges) <= 32


def grid_search_boundaries(
    lengths: list[int], k: int, *, token_budget: int, max_batch_size: int, num_candidates: int
) -> list[int]:
    """Reference: every choice of ``k - 1`` cuts from the same candidate edges, scored by
    the exact model; the edges of the cheapest."""
    candidates = candidate_edges(lengths, num_candidates)
    cuts = min(k - 1, len(candidates))
    tail = [max(lengths) + 1 + extra for extra in range(k - cuts)]
    model = {"token_budget": token_budget, "max_batch_size": max_batch_size}
    every = ([0, *combo, *tail] for combo in itertools.combinations(candidates, cuts))
    return min(every, key=lambda edges: expected_padded_tokens(lengths, edges, **model))


def _well_formed(edges: list[int], lengths: list[int], k: int) -> None:
    assert len(edges) == k + 1
    assert edges[0] == 0
    assert all(lo < hi for lo, hi in itertools.pairwise(edges))
    assert edges[-1] > max(lengths)
    bucket_of(lengths, edges)  # accepted by the packer


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_dp_never_worse_than_grid_search(seed, k):
    lengths = lognormal_lengths(300, 1456, 0.6, seed=seed)
    kwargs = {"token_budget": 16384, "max_batch_size": 16, "num_candidates": 14}
    dp = optimize_boundaries(lengths, k, bin_width=0.0, **kwargs)
    grid = grid_search_boundaries(lengths, k, **kwargs)
    _well_formed(dp, lengths, k)
    _well_formed(grid, lengths, k)
    model = {"token_budget": 16384, "max_batch_size": 16}
    dp_cost = expected_padded_tokens(lengths, dp, **model)
    assert dp_cost <= expected_padded_tokens(lengths, grid, **model) * (1 + 1e-12)
    # ... and no worse than any other cut set drawn from the same candidates.
    candidates = candidate_edges(lengths, 14)
    rng = random.Random(seed)
    for _ in range(20):
        cuts = sorted(rng.sample(candidates, k - 1))
        other = [0, *cuts, max(lengths) + 1]
        assert dp_cost <= expected_padded_tokens(lengths, other, **model) * (1 + 1e-12)


def test_binned_model_finds_the_exact_optimum_cost():
    lengths = lognormal_lengths(1500, 1456, 0.54, seed=7)
    kwargs = {"token_budget": 49152, "max_batch_size": 64, "num_candidates": 48}
    binned = optimize_boundaries(lengths, 5, **kwargs)
    exact = optimize_boundaries(lengths, 5, bin_width=0.0, **kwargs)
    model = {"token_budget": 49152, "max_batch_size": 64}
    binned_cost = expected_padded_tokens(lengths, binned, **model)
    assert binned_cost <= expected_padded_tokens(lengths, exact, **model) * 1.001


def test_few_distinct_lengths_pad_with_empty_buckets():
    lengths = [40] * 30 + [90] * 30
    edges = optimize_boundaries(lengths, 4, token_budget=1000, max_batch_size=8)
    assert edges == [0, 90, 91, 92, 93]
    batches = plan_epoch(lengths, mode="bucketed", token_budget=1000, boundaries=edges)
    assert sorted(i for b in batches for i in b) == list(range(60))


@pytest.fixture(scope="module")
def optimized_edges() -> list[int]:
    return optimize_boundaries(LOGNORMAL, 6, **SEED_SETTINGS)


def test_predicted_efficiency_tracks_the_real_packer(optimized_edges):
    edges = optimized_edges
    _well_formed(edges, LOGNORMAL, 6)
    predicted = predict_efficiency(LOGNORMAL, edges, **SEED_SETTINGS)
    simulated = simulate_bucketed(LOGNORMAL, edges, **SEED_SETTINGS)
    assert abs(predicted - simulated) < 0.02
    assert 0.80 < simulated < 0.90


def test_optimized_edges_beat_the_seed_boundaries(optimized_edges):
    edges = optimized_edges
    ours = predict_efficiency(LOGNORMAL, edges, **SEED_SETTINGS)
    seed = predict_efficiency(LOGNORMAL, SEED_BOUNDARIES, **SEED_SETTINGS)
    assert ours > seed + 0.003
    simulated = simulate_bucketed(LOGNORMAL, edges, **SEED_SETTINGS)
    assert simulated > simulate_bucketed(LOGNORMAL, SEED_BOUNDARIES, **SEED_SETTINGS)


def test_bucket_table_rows_agree_with_data_and_packer():
    rows = bucket_table(LOGNORMAL, SEED_BOUNDARIES, **SEED_SETTINGS)
    assert [(r.lo, r.hi) for r in rows] == list(itertools.pairwise(SEED_BOUNDARIES))
    for row in rows:
        members = [n for n in LOGNORMAL if row.lo <= n < row.hi]
        assert row.count == len(members)
        assert row.mean_length == pytest.approx(statistics.fmean(members))
        b = row.batch_size
        assert 1 <= b <= 64
        assert b * expected_max(members, b) <= 49152 or b == 1
        if b < min(64, len(members)):
            assert (b + 1) * expected_max(members, b + 1) > 49152
        assert row.predicted_efficiency == pytest.approx(
            predict_efficiency(members, [row.lo, row.hi], **SEED_SETTINGS)
        )
    # Rows are per-bucket slices of the same three simulated epochs.
    padded = sum(3 * row.count * row.mean_length / row.efficiency for row in rows)
    overall = 3 * sum(LOGNORMAL) / padded
    assert overall == pytest.approx(simulate_bucketed(LOGNORMAL, SEED_BOUNDARIES, **SEED_SETTINGS))


def test_optimizer_gives_well_formed_edges_on_a_sharegpt_sized_sample():
    # Its time on this sample: experiments/grouping/optimizer_time.py (no timed assertion
    # here: a loaded machine says nothing about the code).
    lengths = lognormal_lengths(17545, 1456, 0.54, seed=0)
    edges = optimize_boundaries(lengths, 6, num_candidates=128, **SEED_SETTINGS)
    _well_formed(edges, lengths, 6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be"),
        ({"token_budget": 0}, "token_budget"),
        ({"max_batch_size": -1}, "max_batch_size"),
        ({"lengths": []}, "must not be empty"),
        ({"lengths": [5, 0, 3]}, r"lengths\[1\]"),
    ],
)
def test_optimizer_errors(kwargs, message):
    arguments = {"lengths": [5, 9, 3], "k": 2, "token_budget": 100, "max_batch_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        optimize_boundaries(**arguments)


def test_prediction_rejects_edges_that_miss_samples():
    with pytest.raises(ValueError, match="longest sample"):
        predict_efficiency([10, 500], [0, 100, 400], token_budget=1000, max_batch_size=4)
