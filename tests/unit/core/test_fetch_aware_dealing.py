"""Dealing that sees fetch time (``batching.policy.fetch_aware_dealing``): a rank whose
samples arrive slowly is dealt less of the epoch, on the simulator with a per-rank fetch
time, and the guarantees hold (every sample once, equal step counts)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb_lightning.core.alignment import plan_round
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.dealing import behind_ranks, deal_caps, fetch_shares
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.core.wire import RankReport


def _report(dealt_cost: int, wait_us: int, elapsed_us: int, **fields: object) -> RankReport:
    values = {
        "epoch": 0,
        "round_index": 3,
        "aborted": False,
        "finished": False,
        "free_slots": 8,
        "buffered": 4,
        "num_groups": 0,
        "undealt": 100,
        "wanted": 50,
        "full": False,
        "dealt_cost": dealt_cost,
        "dealt_samples": dealt_cost // 10,
        "wait_us": wait_us,
        "elapsed_us": elapsed_us,
    }
    return RankReport(**(values | fields))


def test_equal_shares_until_a_rank_waits_for_its_samples() -> None:
    assert fetch_shares([_report(500, 0, 10_000), _report(500, 0, 10_000)]) is None
    reports = [_report(500, 0, 10_000), _report(500, 0, 10_000)]
    assert deal_caps(reports, fetch_aware=True) == deal_caps(reports)


def test_a_rank_that_waits_is_dealt_less_and_the_fast_one_more() -> None:
    # Rank 1 waited 9 of the 10 seconds for its own samples, rank 0 none.
    reports = [_report(500, 0, 10_000_000), _report(500, 9_000_000, 10_000_000)]
    shares = fetch_shares(reports)
    assert shares is not None and abs(sum(shares) - 1) < 1e-9
    assert shares[0] > 0.85 > 0.15 > shares[1]
    fast, slow = deal_caps(reports, fetch_aware=True)
    level = deal_caps(reports)
    assert fast > level[0] and slow < level[1]


def test_shares_are_a_function_of_the_reports_alone() -> None:
    reports = [_report(300 + 40 * r, 100_000 * r * r, 5_000_000) for r in range(6)]
    assert fetch_shares(reports) == fetch_shares(list(reports))
    shares = fetch_shares(reports)
    assert shares is not None and shares == sorted(shares, reverse=True)


def test_a_rank_at_its_share_emits_without_waiting_for_more() -> None:
    # Rank 1 is not full, but at its share: the round emits instead of only dealing.
    shown = {"num_groups": 1, "group_sizes": (2,), "group_loss_tokens": (20,)}
    reports = [
        _report(500, 0, 10_000_000, full=True, wanted=0, group_costs=(90,), **shown),
        _report(500, 9_000_000, 10_000_000, wanted=5, group_costs=(80,), **shown),
    ]
    assert deal_caps(reports, fetch_aware=True)[1] == 0
    plan = plan_round(reports, join=True, fetch_aware=True)
    assert plan.target_steps == 1 and plan.deals == (0, 0)
    plain = plan_round(reports, join=True)
    assert plain.target_steps == 0, "dealing by work alone waits for rank 1's window"
    assert plain.deals[1] > 0


def test_the_slow_rank_case_runs_more_on_the_fast_rank_and_ends_sooner() -> None:
    # Two ranks, rank 1 fetching 0.15 s a sample, rank 0 1 ms: the simulated epoch.
    lengths = lognormal_lengths(120, mean=200, cv=0.8, seed=0, max_len=1024)
    results = {
        (aware, cross): simulate_dealt_epoch(
            lengths,
            2,
            BatchingConfig.of(
                token_budget=1024, fetch_aware_dealing=aware, cross_rank_grouping=cross
            ),
            fetch_us=[1_000, 150_000],
        )
        for aware in (False, True)
        for cross in (False, None)
    }
    for result in results.values():
        _check_once(result, len(lengths))
    # Each rank runs what it fetched unless rounds group across ranks (which hands the
    # fetched samples out level, so there only the epoch's time tells).
    ran = [sum(s.group.size for s in steps if s.group) for steps in results[True, False].steps]
    assert ran[0] > 2 * ran[1]
    for cross in (False, None):
        assert results[True, cross].fetch_us <= 0.7 * results[False, cross].fetch_us


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 200),
    world=st.integers(1, 6),
    seed=st.integers(0, 1000),
    budget=st.sampled_from([64, 512, 2048]),
    depth=st.integers(1, 100),
    ramp=st.one_of(st.none(), st.integers(1, 3)),
    crg=st.booleans(),
)
def test_every_sample_once_on_equal_steps_whatever_the_fetch_times(
    n: int, world: int, seed: int, budget: int, depth: int, ramp: int | None, crg: bool
) -> None:
    lengths = lognormal_lengths(n, mean=150, cv=1.0, seed=seed, max_len=1024)
    config = BatchingConfig.of(
        token_budget=budget,
        outstanding_depth=depth,
        ramp_budgets=ramp,
        fetch_aware_dealing=True,
        cross_rank_grouping=crg,
        seed=seed,
    )
    fetch = [(seed * (r + 1)) % 7 * 10_000 for r in range(world)]
    _check_once(simulate_dealt_epoch(lengths, world, config, fetch_us=fetch), n)


def _check_once(result, n: int) -> None:
    assert len({len(steps) for steps in result.steps}) == 1
    ran = Counter(
        m.sample_id for steps in result.steps for s in steps if s.group for m in s.group.samples
    )
    assert sorted(ran) == list(range(n)) and set(ran.values()) <= {1}


def test_it_needs_one_dealt_order() -> None:
    with pytest.raises(ValueError, match="fetch_aware_dealing=true needs .*by_need"):
        BatchingConfig.of(fetch_aware_dealing=True, shard_dealing="fixed")


def test_no_shares_while_the_speeds_do_not_differ_materially() -> None:
    # Timing noise: 1.0 s and 1.2 s of waiting in 10 s (ratio under 1.5).
    noise = [_report(500, 1_000_000, 10_000_000), _report(500, 1_200_000, 10_000_000)]
    assert fetch_shares(noise) is None and behind_ranks(noise) == []
    # Fetching does not bound the epoch: rank 1 waited 0.5 % of it, if 50x rank 0.
    idle = [_report(500, 1_000, 10_000_000), _report(500, 50_000, 10_000_000)]
    assert fetch_shares(idle) is None
    assert deal_caps(idle, fetch_aware=True) == deal_caps(idle)


def test_on_by_default_where_samples_are_dealt_by_need() -> None:
    assert BatchingConfig.of().policy.deals_by_fetch_time  # by_need, the default
    assert not BatchingConfig.of(shard_dealing="fixed").policy.deals_by_fetch_time
    assert OnlinePolicy().fetch_aware_dealing is None
    assert not BatchingConfig.of(fetch_aware_dealing=False).policy.deals_by_fetch_time


def test_a_rank_that_is_behind_is_sent_no_work() -> None:
    """The slow rank's window holds more of the waiting samples than its speed warrants:
    it is behind, and no round groups across ranks while it is, so no sample moves toward
    it (dealt by work with the moves, it ran 65 of 120 samples)."""
    reports = [_report(500, 0, 10_000_000), _report(500, 9_000_000, 10_000_000)]
    assert behind_ranks(reports) == [1]  # 4 buffered of 8 against a share under 0.15
    light = [reports[0], _report(500, 9_000_000, 10_000_000, buffered=1)]
    assert behind_ranks(light) == []
    lengths = lognormal_lengths(120, mean=200, cv=0.8, seed=0, max_len=1024)
    config = BatchingConfig.of(token_budget=1024)  # fetch-aware: the default dealt by need
    result = simulate_dealt_epoch(lengths, 2, config, fetch_us=[1_000, 150_000])
    _check_once(result, len(lengths))
    assert result.moved_samples[1] == 0
    level = simulate_dealt_epoch(lengths, 2, config, fetch_us=[1_000, 1_000])
    assert sum(level.moved_samples) > 0, "at equal speeds rounds still group across ranks"


def test_without_fetch_aware_dealing_no_round_reads_a_time() -> None:
    """``fetch_aware_dealing=false``: the deal and the pooled rounds are a function of the
    samples alone, whatever each rank's fetch time (what the runtime tests compare with
    the simulator, on a machine of any load)."""
    lengths = lognormal_lengths(120, mean=200, cv=0.8, seed=0, max_len=1024)
    config = BatchingConfig.of(token_budget=1024, fetch_aware_dealing=False)
    slow = simulate_dealt_epoch(lengths, 2, config, fetch_us=[1_000, 150_000])
    level = simulate_dealt_epoch(lengths, 2, config, fetch_us=[1_000, 1_000])
    _check_once(slow, len(lengths))
    assert slow.steps == level.steps and sum(slow.moved_samples) > 0
