"""The grouping window state machine: filling, readiness, arrival-order independence."""

from __future__ import annotations

import pytest

from odb_lightning.core.alignment import AlignmentError, plan_round
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import make_rng
from odb_lightning.core.types import SampleInfo
from odb_lightning.core.window import GroupingWindow, exchange_round

# Fixed shards: the window requests from its own shard (dealt by need, see test_simulate).
# No ramp: these pin the cap of D samples (the ramp has its own tests below).
SETTINGS = BatchingConfig.of(
    token_budget=64,
    outstanding_depth=6,
    max_steps_per_round=4,
    shard_dealing="fixed",
    ramp_budgets=None,
)
LENGTHS = [9, 30, 2, 17, 5, 40, 8, 3, 12, 21]


def info(position: int) -> SampleInfo:
    return SampleInfo(position, LENGTHS[position], LENGTHS[position] // 2, position)


def drain(window: GroupingWindow, arrival_seed: int | None) -> list[list[int]]:
    """Run one rank to the end of its epoch; arrivals shuffled by ``arrival_seed``."""
    emitted = []
    while not window.epoch_over:
        positions = list(window.request())
        if arrival_seed is not None:
            make_rng(arrival_seed, window.round_index).shuffle(positions)
        for position in positions:
            window.add(info(position))
        outcome = exchange_round(window, lambda message: [message])
        emitted += [[s.sample_id for s in step.group.samples] for step in outcome.steps]
    return emitted


def test_request_respects_depth_and_shard() -> None:
    window = GroupingWindow(SETTINGS, shard_size=len(LENGTHS))
    assert list(window.request()) == [0, 1, 2, 3, 4, 5]
    assert list(window.request()) == []
    assert not window.is_ready()
    for position in range(6):
        window.add(info(position))
    assert window.is_ready() and window.num_buffered == 6


def test_arrival_order_does_not_change_the_steps() -> None:
    reference = drain(GroupingWindow(SETTINGS, len(LENGTHS)), arrival_seed=None)
    for seed in range(5):
        assert drain(GroupingWindow(SETTINGS, len(LENGTHS)), arrival_seed=seed) == reference
    assert sorted(i for step in reference for i in step) == list(range(len(LENGTHS)))


def test_unrequested_sample_and_early_report_are_refused() -> None:
    window = GroupingWindow(SETTINGS, shard_size=len(LENGTHS))
    with pytest.raises(ValueError, match="was not requested"):
        window.add(info(0))
    window.request()
    with pytest.raises(RuntimeError, match="not ready"):
        window.make_report()


def test_apply_checks_its_row_of_the_plan() -> None:
    window = GroupingWindow(SETTINGS, shard_size=len(LENGTHS))
    for position in window.request():
        window.add(info(position))
    other = GroupingWindow(SETTINGS, shard_size=1, rank=0)
    other.request()
    other.add(SampleInfo(0, 5, 1, 0))
    mine = window.make_report()
    # A plan computed from someone else's report must not be silently accepted.
    plan = plan_round([other.make_report()], join=True)
    with pytest.raises(AlignmentError, match="plan says"):
        window.apply(plan)
    assert mine.buffered == 6


def test_empty_shard_is_finished_at_once() -> None:
    window = GroupingWindow(SETTINGS, shard_size=0)
    assert window.is_ready() and window.is_finished()
    outcome = exchange_round(window, lambda message: [message])
    assert outcome.epoch_over and outcome.dropped == 0


WORK = BatchingConfig.of(
    token_budget=32,
    outstanding_depth=8,
    window_budgets=2,
    max_steps_per_round=4,
    shard_dealing="fixed",
)


def fill(window: GroupingWindow, arrival_seed: int | None = None) -> list[int]:
    """Deliver requests until the window is ready; returns how many each request asked."""
    asked = []
    while positions := list(window.request()):
        asked.append(len(positions))
        assert list(window.request()) == [], "asked again with samples in flight"
        if arrival_seed is not None:
            make_rng(arrival_seed, len(asked)).shuffle(positions)
        for position in positions:
            window.add(info(position))
    assert window.is_ready()
    return asked


def test_window_sized_in_work_fills_to_its_budgets() -> None:
    window = GroupingWindow(WORK, shard_size=len(LENGTHS))
    # 2 samples first (9 + 30 = 39 of 64); then the missing 25 at their mean cost 19.5: 2
    # more (2 + 17 = 19, 58 in all); then 6 at the mean 14.5: 1 more (5): 63; then 1 (40).
    assert fill(window) == [2, 2, 1, 1]
    assert sum(LENGTHS[:6]) >= 64 > sum(LENGTHS[:5])
    assert window.num_buffered == 6


def test_window_sized_in_work_stops_at_the_sample_cap() -> None:
    capped = BatchingConfig.of(
        token_budget=32, outstanding_depth=3, window_budgets=8, shard_dealing="fixed"
    )
    window = GroupingWindow(capped, shard_size=len(LENGTHS))
    fill(window)
    assert window.num_buffered == 3


def test_window_sized_in_work_stops_at_the_byte_cap() -> None:
    def asks(cap_mib: float | None) -> tuple[list[int], GroupingWindow]:
        # 40 samples of 4 tokens, 100 KiB each: 8 budgets of 32 tokens would take all.
        config = BatchingConfig.of(
            token_budget=32,
            window_budgets=8,
            window_max_mib=cap_mib,
            shard_dealing="fixed",
            ramp_budgets=None,
        )
        window = GroupingWindow(config, shard_size=40)
        asked = []
        while positions := list(window.request()):
            asked.append(len(positions))
            for p in positions:
                window.add(SampleInfo(p, 4, 2, p, num_bytes=100 * 1024))
        return asked, window

    # Blind first ask (window_budgets samples: 800 KiB); then the 224 KiB left hold 2
    # samples at the mean size; then one more passes the cap by less than a sample.
    asked, window = asks(1.0)
    assert asked == [8, 2, 1] and window.is_ready()
    assert window.num_buffered_bytes == 1100 * 1024 < 2**20 + 100 * 1024
    asked, window = asks(None)
    assert window.num_buffered == 40, "without the cap the budgets bind: every sample"


def test_window_sized_in_work_is_independent_of_arrival_order() -> None:
    def drain_work(arrival_seed: int | None) -> list[list[int]]:
        window = GroupingWindow(WORK, len(LENGTHS))
        emitted = []
        while not window.epoch_over:
            fill(window, arrival_seed)
            outcome = exchange_round(window, lambda message: [message])
            emitted += [[s.sample_id for s in step.group.samples] for step in outcome.steps]
        return emitted

    reference = drain_work(None)
    assert sorted(i for step in reference for i in step) == list(range(len(LENGTHS)))
    for seed in range(5):
        assert drain_work(seed) == reference
