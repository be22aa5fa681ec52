"""Offline epoch plans: coverage, budget, batch sizes, determinism and errors per mode."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb_lightning.core.budget import Budget
from odb_lightning.core.grouping import group_lengths
from odb_lightning.core.modes import MODES
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.plans import bucket_of, pack_in_order, summarize_plan
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.rows import PackedRows

LENGTHS = st.lists(st.integers(1, 3000), min_size=1, max_size=150)
BUDGETS = st.integers(1, 12000)


def _edges_for(lengths: list[int], cuts: list[int]) -> list[int]:
    return [0, *sorted({c for c in cuts if 0 < c <= max(lengths)}), max(lengths) + 1]


def _plan(lengths: list[int], mode: str, budget: int, cap: int | None = None, **kwargs):
    return plan_epoch(
        lengths,
        mode=mode,
        token_budget=budget,
        batch_size=kwargs.pop("batch_size", 4),
        max_batch_size=cap,
        boundaries=kwargs.pop("boundaries", _edges_for(lengths, [300, 900, 1800])),
        outstanding_depth=kwargs.pop("window", 16),
        **kwargs,
    )


def _assert_exactly_once(batches: list[list[int]], n: int) -> None:
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(n))
    assert all(batch for batch in batches), "no empty batch"


@settings(max_examples=40, deadline=None)
@given(lengths=LENGTHS, budget=BUDGETS, cap=st.none() | st.integers(1, 20), seed=st.integers(0, 9))
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_covers_each_index_once(mode, lengths, budget, cap, seed):
    _assert_exactly_once(_plan(lengths, mode, budget, cap, seed=seed), len(lengths))


@settings(max_examples=40, deadline=None)
@given(lengths=LENGTHS, budget=BUDGETS, cap=st.none() | st.integers(1, 20), seed=st.integers(0, 9))
@pytest.mark.parametrize("mode", ["bucketed", "oracle", "odb", "odb_packed"])
def test_multi_sample_batches_respect_budget_and_cap(mode, lengths, budget, cap, seed):
    for batch in _plan(lengths, mode, budget, cap, seed=seed):
        sizes = [lengths[i] for i in batch]
        if len(batch) > 1:
            cost = sum(sizes) if mode == "odb_packed" else len(batch) * max(sizes)
            assert cost <= budget
        if cap is not None and mode in ("bucketed", "oracle"):  # the online modes have no cap
            assert len(batch) <= cap


def test_over_budget_sample_is_alone_and_counted():
    lengths = [100, 5000, 100, 100]
    for mode in ("bucketed", "oracle", "odb", "odb_packed"):
        batches = _plan(lengths, mode, 1000)
        assert [1] in batches
        stats = summarize_plan(lengths, batches, 1000, rows=MODES[mode].rows())
        assert stats.over_budget_samples == 1
        assert stats.over_budget_batches == 0


def test_standard_is_the_epoch_permutation_in_fixed_chunks():
    lengths = list(range(1, 104))
    batches = _plan(lengths, "standard", 10**6, batch_size=8, seed=3, epoch=2)
    assert [len(b) for b in batches] == [8] * 12 + [7]
    assert [i for b in batches for i in b] == epoch_permutation(103, 3, 2)


def test_sorted_composition_static_and_order_shuffled_per_epoch():
    lengths = lognormal_lengths(400, 800, 0.8, seed=1)
    plans = [_plan(lengths, "sorted", 10**6, batch_size=8, epoch=e) for e in range(3)]
    compositions = [sorted(map(sorted, plan)) for plan in plans]
    assert compositions[0] == compositions[1] == compositions[2]
    assert plans[0] != plans[1] != plans[2]
    assert sorted(len(b) for b in plans[0]) == [8] * 50
    # Batches are consecutive runs of the (length, index) sort: no overlap in length.
    runs = sorted(plans[0], key=lambda b: min((lengths[i], i) for i in b))
    for lower, upper in zip(runs, runs[1:], strict=False):
        assert max((lengths[i], i) for i in lower) < min((lengths[i], i) for i in upper)


def test_sorted_breaks_ties_by_index():
    batches = _plan([5] * 6, "sorted", 100, batch_size=2)
    assert sorted(batches) == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("mode", list(MODES))
def test_same_seed_same_plan(mode):
    lengths = lognormal_lengths(300, 900, 0.7, seed=2)
    assert _plan(lengths, mode, 8192, 16, seed=5, epoch=1) == _plan(
        lengths, mode, 8192, 16, seed=5, epoch=1
    )


@pytest.mark.parametrize("mode", ["standard", "bucketed", "odb", "odb_packed", "oracle"])
def test_new_epoch_or_seed_changes_the_plan(mode):
    lengths = lognormal_lengths(300, 900, 0.7, seed=2)
    base = _plan(lengths, mode, 8192, 16, seed=5, epoch=0)
    assert base != _plan(lengths, mode, 8192, 16, seed=5, epoch=1)
    assert base != _plan(lengths, mode, 8192, 16, seed=6, epoch=0)


def test_bucketed_batches_stay_in_their_bucket_and_composition_changes():
    lengths = lognormal_lengths(600, 1200, 0.6, seed=4)
    edges = _edges_for(lengths, [800, 1200, 1800])
    bucket = bucket_of(lengths, edges)
    plans = [_plan(lengths, "bucketed", 16384, 32, boundaries=edges, epoch=e) for e in range(2)]
    for batch in plans[0] + plans[1]:
        assert len({bucket[i] for i in batch}) == 1
    assert sorted(map(sorted, plans[0])) != sorted(map(sorted, plans[1]))


def test_bucketed_equal_lengths_fill_to_budget_or_cap():
    lengths = [1000] * 50 + [100] * 200
    batches = _plan(lengths, "bucketed", 16000, 64, boundaries=[0, 500, 1001])
    sizes = sorted(len(b) for b in batches)
    # 1000-token bucket: 16 per batch (16 * 1000 = budget); 100-token bucket: cap 64.
    assert sizes == sorted([16, 16, 16, 2] + [64, 64, 64, 8])


@settings(max_examples=60, deadline=None)
@given(lengths=LENGTHS, budget=BUDGETS, cap=st.none() | st.integers(1, 20))
def test_pack_in_order_closes_a_batch_only_when_it_must(lengths, budget, cap):
    order = list(range(len(lengths)))
    batches = pack_in_order(order, lengths, Budget(budget), max_batch_size=cap)
    assert [i for b in batches for i in b] == order  # never reorders
    for batch, following in zip(batches, batches[1:], strict=False):
        grown = [lengths[i] for i in [*batch, following[0]]]
        assert len(grown) * max(grown) > budget or (cap is not None and len(batch) == cap)


@settings(max_examples=40, deadline=None)
@given(lengths=LENGTHS, budget=BUDGETS, cap=st.integers(1, 20))
def test_oracle_is_the_window_grouping_of_the_whole_epoch(lengths, budget, cap):
    for limit in (None, cap):
        batches = _plan(lengths, "oracle", budget, limit)
        expected = group_lengths(lengths, Budget(budget), max_group_size=limit)
        assert sorted(batches) == sorted(expected)  # the same groups, in shuffled order
        assert all(len(b) <= (limit or len(lengths)) for b in batches)


def test_odb_packed_fills_a_real_token_budget():
    lengths = lognormal_lengths(500, 700, 0.9, seed=8)
    batches = _plan(lengths, "odb_packed", 8192, seed=3, window=64)
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 8192 for b in batches if len(b) > 1)
    packed = summarize_plan(lengths, batches, 8192, rows=PackedRows())
    padded = summarize_plan(lengths, _plan(lengths, "odb", 8192, seed=3, window=64), 8192)
    assert packed.padding_efficiency == 1.0
    assert packed.steps < padded.steps  # the same budget buys more real tokens


def test_odb_and_oracle_efficiency_on_lognormal():
    lengths = lognormal_lengths(3000, 1456, 0.54, seed=0)
    oracle = summarize_plan(lengths, _plan(lengths, "oracle", 16384), 16384)
    odb = summarize_plan(lengths, _plan(lengths, "odb", 16384, window=512), 16384)
    standard = summarize_plan(lengths, _plan(lengths, "standard", 16384, batch_size=8), 16384)
    assert oracle.padding_efficiency > 0.99
    assert odb.padding_efficiency > 0.95
    assert odb.steps <= 1.05 * oracle.steps
    assert standard.padding_efficiency < 0.6


def test_summarize_plan_numbers():
    lengths = [10, 4, 6, 20]
    stats = summarize_plan(lengths, [[0, 1], [2], [], [3]], token_budget=16)
    # Padded: 2*10 + 6 + 20 = 46; real 40; three steps; sample 3 is over budget.
    assert stats.steps == 3
    assert stats.mean_batch_size == pytest.approx(4 / 3)
    assert stats.padding_efficiency == pytest.approx(40 / 46)
    assert stats.budget_fill == pytest.approx(46 / 3 / 16)
    assert stats.over_budget_samples == 1
    assert stats.over_budget_batches == 1  # [0, 1] costs 20 > 16
    assert (stats.real_tokens, stats.padded_tokens) == (40, 46)
    packed = summarize_plan(lengths, [[0, 1], [2], [3]], token_budget=16, rows=PackedRows())
    assert packed.padding_efficiency == 1.0 and packed.over_budget_batches == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "standard", "batch_size": None}, "batch_size must be a positive integer"),
        ({"mode": "sorted", "batch_size": 0}, "batch_size must be a positive integer"),
        ({"mode": "odb", "outstanding_depth": None}, "outstanding_depth"),
        ({"mode": "odb_packed", "outstanding_depth": -1}, "outstanding_depth must be a positive"),
        ({"mode": "bucketed"}, "boundaries are required"),
        ({"mode": "bucketed", "boundaries": [0, 50]}, r"lengths\[1\] = 70"),
        ({"mode": "bucketed", "boundaries": [0, 60, 40, 100]}, "strictly increasing"),
        ({"mode": "bucketed", "boundaries": [30, 100]}, r"lengths\[0\] = 20"),
        ({"mode": "oracle", "max_batch_size": 0}, "max_batch_size"),
        ({"mode": "packed"}, "mode must be one of"),
        ({"mode": "oracle", "token_budget": 0}, "token_budget"),
    ],
)
def test_clear_errors_name_the_parameter(kwargs, message):
    arguments = {"token_budget": 1000, **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_epoch([20, 70, 30], **arguments)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "7"])
def test_bad_length_names_its_index(bad):
    with pytest.raises(ValueError, match=r"lengths\[2\]"):
        plan_epoch([5, 6, bad, 7], mode="oracle", token_budget=100)


def test_mode_accepts_enum_and_string():
    lengths = [3, 1, 2]
    assert plan_epoch(lengths, mode="oracle", token_budget=9) == plan_epoch(
        lengths, mode="oracle", token_budget=9
    )


def test_lognormal_lengths_match_mean_and_cv():
    lengths = lognormal_lengths(40000, 1456, 0.54, seed=0)
    mean = statistics.fmean(lengths)
    assert mean == pytest.approx(1456, rel=0.02)
    assert statistics.pstdev(lengths) / mean == pytest.approx(0.54, rel=0.04)
    assert lengths == lognormal_lengths(40000, 1456, 0.54, seed=0)
    assert lengths != lognormal_lengths(40000, 1456, 0.54, seed=1)
    clipped = lognormal_lengths(1000, 1456, 0.54, seed=0, max_len=1024)
    assert max(clipped) == 1024 and min(clipped) >= 1
    with pytest.raises(ValueError, match="cv"):
        lognormal_lengths(10, 100, -1, seed=0)
