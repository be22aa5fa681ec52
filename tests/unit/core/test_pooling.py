"""Cross-rank grouping of the epoch's tail (``batching.policy.cross_rank_grouping``),
checked on the simulator: every sample exactly once over the ranks, equal step counts,
the global counts of every step, moves accounted on both sides, and the groups handed to
the ranks that hold them."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import group_window
from odb_lightning.core.order import make_rng
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.pool_plan import plan_pool
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.core.sync import group_cost
from odb_lightning.core.types import SampleInfo


@st.composite
def dealt_jobs(draw: st.DrawFn) -> dict:
    seed = draw(st.integers(0, 2**16))
    rng = make_rng(seed, "pool")
    scale = rng.choice([8, 64, 512])
    n = draw(st.integers(0, 300))
    return {
        "lengths": [rng.randint(1, scale) for _ in range(n)],
        "world": draw(st.integers(1, 12)),
        "knobs": {
            "token_budget": draw(st.sampled_from([16, 100, 512, 2048])),
            "outstanding_depth": draw(st.integers(1, 200)),
            "window_budgets": draw(st.one_of(st.none(), st.integers(1, 40))),
            "ramp_budgets": draw(st.one_of(st.none(), st.integers(1, 3))),
            "max_steps_per_round": draw(st.integers(1, 64)),
            "emission_order": draw(st.sampled_from(["shuffled", "paired"])),
            "cross_rank_grouping": True,
            "pool_below_sync": draw(st.sampled_from([0.5, 0.97, 1.0])),
            "seed": seed,
        },
    }


@settings(max_examples=120, deadline=None)
@given(dealt_jobs())
def test_every_sample_runs_once_on_equal_steps_with_moves_accounted(job: dict) -> None:
    lengths, world = job["lengths"], job["world"]
    config = BatchingConfig.of(**job["knobs"])
    losses = [n // 2 for n in lengths]
    result = simulate_dealt_epoch(lengths, world, config, loss_tokens=losses)
    assert len({len(steps) for steps in result.steps}) == 1
    ran = Counter(
        m.sample_id for steps in result.steps for s in steps if s.group for m in s.group.samples
    )
    assert sorted(ran) == list(range(len(lengths))) and set(ran.values()) <= {1}
    assert result.dropped == [0] * world
    for column in zip(*result.steps, strict=True):
        groups = [s.group for s in column]
        assert {s.global_samples for s in column} == {sum(g.size for g in groups if g)}
        assert {s.global_loss_tokens for s in column} == {
            sum(losses[m.sample_id] for g in groups if g for m in g.samples)
        }
        assert any(g is not None for g in groups), "a step position where every rank is IDLE"
        for g in groups:
            if g is not None and g.size > 1:
                assert g.size * g.longest <= config.token_budget
    assert sum(result.moved_samples) <= len(lengths)
    if world == 1:
        assert result.moved_samples == (0,)


def test_an_offer_round_trips_and_is_no_report() -> None:
    from odb_lightning.core.pooling import decode_offer, encode_offer
    from odb_lightning.core.wire import report_max_steps

    samples = [SampleInfo(sample_id=9, length=5, num_loss_tokens=2, position=3, num_bytes=80)]
    message = encode_offer(samples, 4)
    assert decode_offer(message) == samples and report_max_steps(message) is None
    with pytest.raises(ValueError, match="not a pooled round's offer"):
        decode_offer([4, *message[1:]])


def _offer(rank_lengths: list[list[int]]) -> list[list[SampleInfo]]:
    offers, position = [], 0
    for lengths in rank_lengths:
        offer = []
        for n in lengths:
            offer.append(
                SampleInfo(sample_id=position, length=n, num_loss_tokens=n, position=position)
            )
            position += 1
        offers.append(offer)
    return offers


def test_groups_stay_with_the_rank_that_holds_them() -> None:
    # Rank 0 holds every long sample, rank 1 every short one: the union's groups are each
    # one rank's, so nothing moves.
    offers = _offer([[100] * 8, [25] * 32])
    budget = BatchingConfig.of(token_budget=400).budget
    plan = plan_pool(offers, budget)
    assert all(plan.moved(rank) == ([], []) for rank in range(2))
    assert plan.steps == 2


def test_a_sample_stays_where_it_was_fetched_when_moving_buys_nothing() -> None:
    # 4 ranks, each 8 samples of 100 tokens, their positions interleaved (as a dealt
    # order gives them): the union's groups of 8 would each hold 2 samples of every
    # rank, so 24 of 32 would move. Every rank's own group is as full and level (800 of
    # 800), so the round keeps every sample where it was fetched.
    offers = [
        [SampleInfo(sample_id=4 * i + r, length=100, position=4 * i + r) for i in range(8)]
        for r in range(4)
    ]
    budget = BatchingConfig.of(token_budget=800).budget
    plan = plan_pool(offers, budget)
    assert plan.steps == 1 and plan.global_samples == (32,)
    assert all(plan.moved(rank) == ([], []) for rank in range(4))
    assert plan.max_costs == (800,) and plan.cost_sums == (3200,)
    # A rank that holds the one long sample alone still lends its short ones: moving
    # them levels the position (the local plan would leave three ranks waiting).
    skewed = _offer([[400, 100, 100, 100, 100], [100, 100], [100, 100], [100]])
    plan = plan_pool(skewed, budget)
    assert sum(len(plan.moved(rank)[0]) for rank in range(4)) > 0


def test_positions_pair_groups_of_like_cost_costliest_first() -> None:
    rng = make_rng(0, "offers")
    offers = _offer([[rng.randint(10, 400) for _ in range(60)] for _ in range(4)])
    budget = BatchingConfig.of(token_budget=800).budget
    plan = plan_pool(offers, budget)
    assert list(plan.max_costs) == sorted(plan.max_costs, reverse=True)
    every = sorted(
        s.position for groups in plan.rank_groups for g in groups if g for s in g.samples
    )
    assert every == list(range(240))
    received = sum(len(plan.moved(r)[0]) for r in range(4))
    assert received == sum(len(plan.moved(r)[1]) for r in range(4))


def test_a_capped_pool_runs_its_costliest_groups_and_leaves_the_rest_where_they_are() -> None:
    rng = make_rng(1, "offers")
    offers = _offer([[rng.randint(10, 400) for _ in range(60)] for _ in range(4)])
    budget = BatchingConfig.of(token_budget=800).budget
    whole, capped = plan_pool(offers, budget), plan_pool(offers, budget, positions=3)
    assert whole.steps > 3 and capped.steps == 3
    run = [g for groups in capped.rank_groups for g in groups if g is not None]
    assert len(run) == 3 * 4, "every rank runs a group at every position"
    # The costliest 12 of the union's groups.
    union = [s for offer in offers for s in offer]
    everything = sorted((_cost(g, budget) for g in group_window(union, budget)), reverse=True)
    assert sorted((_cost(g, budget) for g in run), reverse=True) == everything[:12]
    ran = {s.position for g in run for s in g.samples}
    for rank, offer in enumerate(offers):
        left = {s.position for s in capped.left[rank]}
        assert left == {s.position for s in offer} - ran, f"rank {rank} keeps what no step runs"
    assert sorted(ran | {s.position for kept in capped.left for s in kept}) == list(range(240))
    with pytest.raises(ValueError, match="at least one step position"):
        plan_pool(offers, budget, positions=0)


def test_a_capped_pool_runs_whole_positions_and_over_budget_samples_w_at_a_time() -> None:
    # 4 ranks, budget 800: 6 samples of 1,000 tokens (over the budget, each alone) and
    # 68 of 200 (4 to a group: 17 groups). Capped at 8 positions, a round runs
    # over-budget samples in fours and whole positions only: 4 of the 6 over the budget
    # and 16 groups of 200s (5 positions of 4); the other 2 over the budget and the
    # 17th group stay where they are.
    two, one = [1000, 1000, *[200] * 17], [1000, *[200] * 17]
    offers = _offer([two, two, one, one])
    budget = BatchingConfig.of(token_budget=800).budget
    capped = plan_pool(offers, budget, positions=8)
    run = [g for groups in capped.rank_groups for g in groups if g is not None]
    assert len(run) == 4 * capped.steps, "no position holds an IDLE rank"
    over = [g for g in run if g.size == 1 and budget.is_over_budget(g.longest)]
    assert len(over) == 4 and capped.max_costs[0] == capped.cost_sums[0] // 4
    assert all(c * 4 == total for c, total in zip(capped.max_costs, capped.cost_sums, strict=True))
    left = [s for kept in capped.left for s in kept]
    assert capped.steps == 5
    assert sorted(s.length for s in left) == [200] * 4 + [1000] * 2
    assert len(left) + sum(g.size for g in run) == sum(map(len, offers))
    # The epoch's last round (no cap) runs everything, mixed or not.
    whole = plan_pool(offers, budget)
    assert sum(g.size for gs in whole.rank_groups for g in gs if g) == sum(map(len, offers))


def _cost(group, budget) -> int:
    return math.ceil(group_cost(group, budget))


def test_a_small_epoch_beats_its_per_rank_floor_with_the_ramp_on_or_off() -> None:
    # About 20 budgets of work per rank at 8 ranks: the ramp's rounds pool their few
    # steps, then one round pools the rest.
    lengths = lognormal_lengths(3900, mean=688, cv=0.9, seed=3, max_len=4096)
    oracle = len(plan_epoch(lengths, mode="oracle", token_budget=16384)) / 8
    for ramp in (2, None):
        results = {
            crg: simulate_dealt_epoch(
                lengths,
                8,
                BatchingConfig.of(token_budget=16384, cross_rank_grouping=crg, ramp_budgets=ramp),
            )
            for crg in (False, True)
        }
        assert results[True].sync.steps < results[False].sync.steps
        assert results[True].sync.utilization > results[False].sync.utilization + 0.03
        assert results[True].sync.utilization >= 0.95, ramp
        assert results[True].sync.steps <= 1.05 * oracle, ramp
        assert sum(results[True].moved_samples) > 0 and sum(results[False].moved_samples) == 0
        assert results[True].pool_plan_s and not results[False].pool_plan_s, "timed per round"


def test_a_tail_over_q_groups_pools_in_capped_rounds_and_beats_the_per_rank_floor() -> None:
    # The mix profile at 16,384 on 8 ranks: once nothing is undealt the windows hold more
    # than Q = 128 groups, so the tail runs the union's costliest 128 x 8 groups and the
    # next round pools the rest (per rank: the ramp's 1, 1 and 32 steps, then 128 steps,
    # then 2; each rank on its own would end in 3 steps at sync 0.86).
    from odb_lightning.core.grouping import group_lengths
    from odb_lightning.data.synthetic import LENGTH_PROFILES

    lengths = LENGTH_PROFILES["sharegpt_mix"].lengths(21200, seed=0, max_len=4096)
    config = BatchingConfig.of(token_budget=16384)
    assert config.policy.groups_across_ranks  # the defaults group across ranks
    result = simulate_dealt_epoch(lengths, 8, config)
    ordered = sorted(lengths, reverse=True)
    floor = max(len(group_lengths(ordered[rank::8], config.budget)) for rank in range(8))
    plain = simulate_dealt_epoch(lengths, 8, BatchingConfig.of(config, cross_rank_grouping=False))
    assert len(result.steps[0]) < floor < len(plain.steps[0])
    per_round = Counter(s.round_index for s in result.steps[0])
    *_, capped, last = sorted(per_round)
    assert per_round[capped] == config.policy.max_steps_per_round
    assert per_round[last] < 3

    def level(column) -> float:
        costs = [_cost(s.group, config.budget) if s.group else 0 for s in column]
        return sum(costs) / len(costs) / max(costs)

    capped_columns = [c for c in zip(*result.steps, strict=True) if c[0].round_index == capped]
    assert statistics.fmean(map(level, capped_columns)) > 0.998


def test_the_ramp_rounds_pool_and_keep_every_rank_level() -> None:
    lengths = lognormal_lengths(3900, mean=688, cv=0.9, seed=3, max_len=4096)
    config = BatchingConfig.of(token_budget=16384, cross_rank_grouping=True)
    result = simulate_dealt_epoch(lengths, 8, config)
    last_round = result.steps[0][-1].round_index
    columns = list(zip(*result.steps, strict=True))
    ramp_steps = [column for column in columns if column[0].round_index < last_round]
    assert ramp_steps, "the ramp emitted no step before the last round"
    plain = simulate_dealt_epoch(lengths, 8, BatchingConfig.of(config, cross_rank_grouping=False))
    budget = config.budget

    def level(column) -> float:  # the step's sync efficiency: mean cost over the most
        costs = [_cost(s.group, budget) if s.group else 0 for s in column]
        return sum(costs) / len(costs) / max(costs)

    # Pooled, the ranks' first steps cost about the same; alone, they do not.
    first_plain = next(zip(*plain.steps, strict=True))
    assert level(ramp_steps[0]) > 0.95 > level(first_plain)
    assert all(level(column) > 0.95 for column in ramp_steps)


def test_one_rank_or_a_union_too_large_to_plan_groups_per_rank(monkeypatch) -> None:
    from odb_lightning.core import pooling

    lengths = lognormal_lengths(3900, mean=688, cv=0.9, seed=3, max_len=4096)
    config = BatchingConfig.of(token_budget=16384)
    alone = BatchingConfig.of(config, cross_rank_grouping=False)

    def steps(result) -> list:
        return [[s.group for s in rank] for rank in result.steps]

    one = simulate_dealt_epoch(lengths, 1, config)
    assert not one.pool_plan_s and steps(one) == steps(simulate_dealt_epoch(lengths, 1, alone))
    assert simulate_dealt_epoch(lengths, 8, config).pool_plan_s  # the same job pools at 8
    monkeypatch.setattr(pooling, "MAX_POOL_SAMPLES", 300)  # below every round's union
    capped = simulate_dealt_epoch(lengths, 8, config)
    assert not capped.pool_plan_s and sum(capped.moved_samples) == 0
    assert steps(capped) == steps(simulate_dealt_epoch(lengths, 8, alone))


def test_it_needs_one_dealt_order_and_join() -> None:
    with pytest.raises(ValueError, match="cross_rank_grouping=true needs .*shard_dealing=by_need"):
        BatchingConfig.of(cross_rank_grouping=True, shard_dealing="fixed")
    with pytest.raises(ValueError, match="join=true"):
        BatchingConfig.of(cross_rank_grouping=True, join=False)


def _tailed(n: int, budget: int, seed: int) -> list[int]:
    """Lengths under ``budget`` with a 5 % tail at twice it (each such sample runs alone)."""
    rng = make_rng(seed, "tail")
    base = lognormal_lengths(n, mean=budget // 5, cv=0.9, seed=seed, max_len=budget)
    return [2 * budget if rng.random() < 0.05 else length for length in base]


def test_rounds_uneven_from_samples_over_the_budget_pool_and_level_them() -> None:
    lengths = _tailed(4000, 2048, seed=0)
    results = {
        crg: simulate_dealt_epoch(
            lengths, 8, BatchingConfig.of(token_budget=2048, cross_rank_grouping=crg)
        )
        for crg in (False, True)
    }
    assert results[False].sync.utilization < 0.93
    assert results[True].sync.utilization > 0.97
    # Every rank runs the same number of over-budget samples at a position: they fill
    # whole positions, so a position holds W of them or none (but the last).
    over = [
        sum(s.group is not None and s.group.longest > 2048 for s in column)
        for column in zip(*results[True].steps, strict=True)
    ]
    assert sum(count not in (0, 8) for count in over) <= 1
    assert sum(over) == sum(length > 2048 for length in lengths)


def test_an_even_round_does_not_pool() -> None:
    from odb_lightning.core.pooling import uneven

    assert not uneven([(100, 90, 50), (98, 91, 49)], 0.97)
    assert uneven([(100, 90, 50), (98, 91, 49)], 1.0), "1.0: any round not exactly level"
    assert not uneven([(100, 90, 50), (100, 90, 50)], 1.0)
    assert uneven([(200, 90, 50), (98, 91, 49)], 0.97)
    assert uneven([(100, 90), (0, 0)], 0.97), "an IDLE rank beside a busy one"


def test_pooling_every_uneven_round_groups_the_ranks_as_one_window() -> None:
    # An epoch of several windows per rank: at 0.97 only the ramp and the tail pool; at
    # 1.0 every round that is not exactly level does, and the steps approach the oracle's.
    lengths = lognormal_lengths(6000, mean=900, cv=1.0, seed=5, max_len=4096)
    oracle = len(plan_epoch(lengths, mode="oracle", token_budget=8192)) / 4
    results = {
        below: simulate_dealt_epoch(
            lengths,
            4,
            BatchingConfig.of(token_budget=8192, cross_rank_grouping=True, pool_below_sync=below),
        )
        for below in (0.97, 1.0)
    }
    assert sum(results[1.0].moved_samples) > 2 * sum(results[0.97].moved_samples)
    assert results[1.0].sync.utilization > results[0.97].sync.utilization
    assert results[1.0].sync.steps < results[0.97].sync.steps
    assert results[1.0].sync.steps <= 1.005 * oracle


@pytest.mark.parametrize("value", [0, -0.5, 1.5, "high", None])
def test_pool_below_sync_is_a_sync_efficiency(value: object) -> None:
    with pytest.raises(ValueError, match=r"pool_below_sync must be a number in \(0, 1\]"):
        BatchingConfig.of(pool_below_sync=value)
