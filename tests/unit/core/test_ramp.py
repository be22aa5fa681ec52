"""The window ramp (``ramp_budgets``): the first round emits after a few budgets of work,
the window grows to ``window_budgets``, every rank ramps in step, and the grouping after
the ramp is that of the full window."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from odb_lightning.core import ramp as ramp_module
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import SettingsMismatchError, check_settings_agree
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.ramp import ramp_targets
from odb_lightning.core.simulate import SimulationResult, simulate_dealt_epoch, simulate_epoch
from odb_lightning.core.types import SampleInfo
from odb_lightning.core.window import GroupingWindow, exchange_round


def _steps_per_round(result: SimulationResult, rank: int = 0) -> list[int]:
    counts: dict[int, int] = {}
    for step in result.steps[rank]:
        counts[step.round_index] = counts.get(step.round_index, 0) + 1
    return [counts[r] for r in sorted(counts)]


@pytest.mark.parametrize(
    ("share", "ramp_steps"), [(ramp_module.RAMP_STEP_SHARE, [1, 1]), (None, [2, 8])]
)
def test_the_window_grows_from_the_ramp_to_the_full_window(
    share: float | None, ramp_steps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Samples of 8 tokens under a budget of 32: every group is 4 samples, one budget.
    # A ramp round emits RAMP_STEP_SHARE steps per budget of its target, at least one
    # (1 and 1 at 2 and 8 budgets), and keeps the rest of its window for the next round;
    # without the share it emits every group.
    monkeypatch.setattr(ramp_module, "RAMP_STEP_SHARE", share)
    config = BatchingConfig.of(
        token_budget=32, window_budgets=16, ramp_budgets=2, shard_dealing="fixed"
    )
    window = GroupingWindow(config, shard_size=400)
    targets, buffered, steps = [], [], []
    while not window.epoch_over:
        targets.append(window.target_budgets)
        while positions := window.request():
            for p in positions:
                window.add(SampleInfo(p, 8, 4, p))
        buffered.append(window.num_buffered)
        outcome = exchange_round(window, lambda message: [message])
        steps.append(len(outcome.steps))
    assert ramp_targets(config.policy) == (2, 8)
    assert targets[:4] == [2, 8, 16, 16]
    assert buffered[:4] == [8, 32, 64, 64]
    assert steps[:4] == [*ramp_steps, 16, 16]
    assert sum(steps) == 100 and buffered[-1] == 0
    no_ramp = GroupingWindow(BatchingConfig.of(config, ramp_budgets=None), shard_size=400)
    assert no_ramp.target_budgets == 16


def test_ramp_is_validated_and_at_the_full_window_is_no_ramp() -> None:
    with pytest.raises(
        ValueError, match=r"batching\.policy\.ramp_budgets must be a positive integer or null"
    ):
        BatchingConfig.of(ramp_budgets=0)
    for ramp in (None, 16, 40):
        config = BatchingConfig.of(window_budgets=16, ramp_budgets=ramp)
        assert ramp_targets(config.policy) == ()
        assert GroupingWindow(config, shard_size=10).target_budgets == 16
    default = BatchingConfig.of().policy
    assert (default.ramp_budgets, default.window_budgets) == (2, 128)
    assert ramp_targets(default) == (2, 8, 32)
    # A window of D samples ramps in work until D budgets.
    samples = BatchingConfig.of(window_budgets=None, outstanding_depth=64, ramp_budgets=4)
    assert ramp_targets(samples.policy) == (4, 16)
    assert GroupingWindow(samples, shard_size=10).target_budgets == 4


def test_ranks_must_agree_on_the_ramp() -> None:
    ramped, flat = BatchingConfig.of(ramp_budgets=2), BatchingConfig.of(ramp_budgets=None)
    with pytest.raises(SettingsMismatchError, match=r"'ramp_budgets' \(rank 0: 2, rank 1: 0\)"):
        check_settings_agree([ramped.handshake(), flat.handshake()])


LENGTHS = lognormal_lengths(6000, 1456, 0.54, seed=3, max_len=4096)
BUDGET = 16384
FULL = 32


def _simulated(world: int, dealing: str, ramp: int | None) -> SimulationResult:
    config = BatchingConfig.of(
        token_budget=BUDGET, window_budgets=FULL, ramp_budgets=ramp, shard_dealing=dealing
    )
    if dealing == "by_need":
        return simulate_dealt_epoch(LENGTHS, world, config)
    return simulate_epoch([LENGTHS[r::world] for r in range(world)], config)


@pytest.mark.parametrize("dealing", ["fixed", "by_need"])
@pytest.mark.parametrize("world", [1, 2, 8])
def test_the_first_step_waits_for_the_ramp_budgets_only(world: int, dealing: str) -> None:
    ramped = _simulated(world, dealing, 2)
    full = _simulated(world, dealing, None)
    for cost in ramped.first_step_cost:
        # Full at 2 budgets; the last request, sized at the mean cost seen and at most as
        # many samples as arrived before it, overshoots by less than a budget (here at
        # most 0.55 of one: a few samples of about 1,500 tokens).
        assert 2 * BUDGET <= cost < 3 * BUDGET
    for cost in full.first_step_cost:
        assert cost >= FULL * BUDGET
    assert max(ramped.first_step_samples) * 10 < min(full.first_step_samples)
    # The first round emits a few steps per rank instead of about FULL.
    assert _steps_per_round(ramped)[0] <= 4 < FULL - 4 <= _steps_per_round(full)[0]


@pytest.mark.parametrize("dealing", ["fixed", "by_need"])
@pytest.mark.parametrize("world", [1, 8])
def test_grouping_after_the_ramp_is_unchanged(world: int, dealing: str) -> None:
    """The ramp's two rounds (2 and 8 budgets) cost at most 2 steps per rank each (here
    -2 to +3 of 75 to 585); the steps of the later rounds pad no more than the full
    window's do (to 0.3 points; the epoch is 67 budgets per rank at 8 ranks, 2 full windows)."""
    ramped = _simulated(world, dealing, 2)
    full = _simulated(world, dealing, None)
    ramp_rounds = len(ramp_targets(BatchingConfig.of(window_budgets=FULL).policy))
    assert ramp_rounds == 2
    assert len(ramped.steps[0]) <= len(full.steps[0]) + 2 * ramp_rounds

    def efficiency(result: SimulationResult, skip: int) -> float:
        emitting = sorted({s.round_index for s in result.steps[0]})[skip:]
        groups = [
            s.group
            for rank in result.steps
            for s in rank
            if s.group is not None and s.round_index in emitting
        ]
        real = sum(m.length for g in groups for m in g.samples)
        return real / sum(g.num_padded_tokens for g in groups)

    # Not worse than the full window's (to 0.3 points; the samples a ramp round keeps
    # are grouped with the next arrivals, which can pad less: +0.36 points at 8 ranks).
    assert efficiency(ramped, ramp_rounds) > efficiency(full, 0) - 0.003


@pytest.mark.parametrize("world", [1, 2, 8])
def test_where_rounds_pool_the_ramps_last_round_covers_the_full_windows_refill(
    world: int,
) -> None:
    """After the ramp's last round (8 of 32 budgets here) the next round waits for the
    window's refill of 24 budgets and more, then plans the first full pooled round over
    every window's union. Where rounds pool, the ramp's last round emits the steps that
    train meanwhile: ceil((32 - 8) / (RAMP_GROWTH - 1)) = 8, a step per budget fetched at
    the ramp's pipeline rule (a budget fetched in under 1 / RAMP_GROWTH of a step), instead
    of the share's 1. One rank, or each rank on its own, keeps the share."""
    pooled = _simulated(world, "by_need", 2)
    alone = simulate_dealt_epoch(
        LENGTHS,
        world,
        BatchingConfig.of(
            token_budget=BUDGET, window_budgets=FULL, ramp_budgets=2, cross_rank_grouping=False
        ),
    )
    policy = BatchingConfig.of(window_budgets=FULL).policy
    last = ramp_targets(policy)[-1]
    cover = math.ceil((FULL - last) / (ramp_module.RAMP_GROWTH - 1))
    assert (last, cover) == (8, 8)
    ramp_rounds = len(ramp_targets(policy))
    assert _steps_per_round(alone)[:ramp_rounds] == [1, 1]
    if world == 1:
        assert _steps_per_round(pooled)[:ramp_rounds] == [1, 1] and not pooled.pool_plan_s
        return
    # Every rank emits the same steps (a function of the data), and the first full round
    # after them is pooled: it is planned while those steps train.
    for rank in range(world):
        assert _steps_per_round(pooled, rank)[:ramp_rounds] == [1, cover]
    queued = [s for s in pooled.steps[0] if s.round_index == pooled.steps[0][1].round_index]
    assert len(queued) == cover
    # Each of them a full step: the costliest group of every position near a budget.
    assert all(s.max_cost >= 0.9 * BUDGET for s in queued)
    assert len(pooled.pool_plan_s) > ramp_rounds, "the full rounds pool too"


def _groups(result: SimulationResult) -> Counter:
    return Counter(
        tuple(sorted(m.sample_id for m in s.group.samples))
        for rank in result.steps
        for s in rank
        if s.group is not None
    )


@pytest.mark.parametrize("work", [3, 8, 12])
@pytest.mark.parametrize("world", [1, 2, 8])
def test_a_small_epoch_is_grouped_whole(
    world: int, work: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch dealt by need of at most SMALL_EPOCH_BUDGETS of work per rank ends its
    ramp as soon as the samples seen tell its size: the first step waits for every
    sample, and the epoch's groups and steps are those of the epoch without a ramp (the
    whole epoch in one window), where the ramp's rounds would fix a few groups first."""
    assert ramp_module.SMALL_EPOCH_BUDGETS == 16
    lengths = lognormal_lengths(world * work * BUDGET // 1456, 1456, 0.54, seed=3, max_len=4096)
    config = BatchingConfig.of(token_budget=BUDGET)
    small = simulate_dealt_epoch(lengths, world, config)
    flat = simulate_dealt_epoch(lengths, world, BatchingConfig.of(config, ramp_budgets=None))
    assert sum(small.first_step_samples) == len(lengths)
    assert _groups(small) == _groups(flat)
    assert len(small.steps[0]) == len(flat.steps[0])
    assert small.sync.utilization == pytest.approx(flat.sync.utilization, abs=1e-12)
    # Without the rule the ramp's first round runs after 2 budgets a rank.
    monkeypatch.setattr(ramp_module, "SMALL_EPOCH_BUDGETS", 0)
    ramped = simulate_dealt_epoch(lengths, world, config)
    assert max(ramped.first_step_cost) < 3 * BUDGET
    assert sum(ramped.first_step_samples) < len(lengths)


def test_the_ramp_ends_where_the_rest_of_the_epoch_fits_its_window() -> None:
    """One rank, an epoch of about 24 budgets (more than a small one): the ramp's rounds
    at 2 and 8 budgets run a step each; then the rest fits the 32-budget window the ramp
    fills to next, so the ramp ends and the next round runs every group of the rest,
    where the ramp's round at 32 would run 4 (RAMP_STEP_SHARE) and leave the rest to a
    later round that nothing more arrives for."""
    lengths = lognormal_lengths(24 * BUDGET // 1456, 1456, 0.54, seed=3, max_len=4096)
    result = simulate_dealt_epoch(lengths, 1, BatchingConfig.of(token_budget=BUDGET))
    steps = _steps_per_round(result)
    assert steps[:2] == [1, 1] and len(steps) == 3
    flat = simulate_dealt_epoch(
        lengths, 1, BatchingConfig.of(token_budget=BUDGET, ramp_budgets=None)
    )
    assert len(result.steps[0]) <= len(flat.steps[0]) + 2


def test_with_fixed_shards_a_small_epoch_keeps_its_ramp() -> None:
    """A window of a fixed shard does not see the other ranks' shards still to fetch, so
    what is left of the epoch is not known alike on every rank: the ramp runs as ever."""
    world = 2
    lengths = lognormal_lengths(world * 6 * BUDGET // 1456, 1456, 0.54, seed=3, max_len=4096)
    config = BatchingConfig.of(token_budget=BUDGET, shard_dealing="fixed")
    result = simulate_epoch([lengths[r::world] for r in range(world)], config)
    assert max(result.first_step_cost) < 3 * BUDGET
    assert _steps_per_round(result)[:2] == [1, 1]


def test_what_is_left_of_the_epoch_is_unknown_before_any_sample_arrives() -> None:
    left = ramp_module.EpochLeft(samples=100, seen_cost=0, seen_samples=0, world=2)
    assert left.per_rank(0) == math.inf
    seen = ramp_module.EpochLeft(samples=100, seen_cost=3000, seen_samples=10, world=2)
    assert seen.per_rank(20) == pytest.approx(80 * 300 / 2)
    assert seen.per_rank(200) == 0
    policy = BatchingConfig.of(token_budget=100).policy  # ramp_budgets 2

    def ends(targets: tuple[int, ...], left_budgets: float, seen: int = 10) -> bool:
        left = ramp_module.EpochLeft(
            samples=round(left_budgets * 4), seen_cost=50 * seen, seen_samples=seen, world=2
        )  # each sample half a budget
        return ramp_module.ramp_ends(policy, targets, left, 0, 100)

    assert not ends((), 0.0)
    assert ends((2, 8), 16.0) and not ends((2, 8), 16.5)
    assert ends((32,), 32.0) and not ends((32,), 32.5)
    # Samples of less than half of the ranks' first ramp window (2 x 2 budgets) tell
    # nothing yet: 4 samples of half a budget are 2 budgets.
    assert not ends((2, 8), 1.0, seen=3) and ends((2, 8), 1.0, seen=4)
