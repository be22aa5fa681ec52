"""Table tests for the DGAP rule on hand-made rounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from odb_lightning.core.alignment import (
    AlignmentError,
    PeerFailedError,
    aligned_steps,
    cost_order,
    peel_order,
    plan_round,
)
from odb_lightning.core.dealing import deal_caps, deal_counts
from odb_lightning.core.wire import RankReport, decode_report, encode_report


def report(
    sizes: list[int],
    losses: list[int] | None = None,
    *,
    peels: list[int] | None = None,
    free: int = 8,
    finished: bool = False,
    round_index: int = 0,
    aborted: bool = False,
    costs: list[int] | None = None,
    peel_costs: list[int] | None = None,
    peel_savings: list[int] | None = None,
) -> RankReport:
    buffered = sum(sizes)
    return RankReport(
        epoch=0,
        round_index=round_index,
        aborted=aborted,
        finished=finished,
        free_slots=free,
        buffered=buffered,
        num_groups=len(sizes),
        group_sizes=tuple(sizes),
        group_loss_tokens=tuple(losses or [10 * s for s in sizes]),
        peel_loss_tokens=tuple(peels or []),
        group_costs=tuple(costs or []),
        peel_costs=tuple(peel_costs or []),
        peel_savings=tuple(peel_savings or []),
    )


def test_peel_order_takes_the_largest_group_earliest_first() -> None:
    assert peel_order([3, 3, 1], 3) == [0, 1, 0]
    assert peel_order([1, 4], 2) == [1, 1]
    with pytest.raises(AlignmentError):
        peel_order([1, 1], 1)


def test_uneven_ranks_split_up_to_the_largest_group_count() -> None:
    plan = plan_round(
        [
            report([4, 3, 3]),
            report([5], [50], peels=[7, 6, 5, 4]),
            report([2, 2], [20, 20], peels=[9, 8]),
        ],
        join=True,
    )
    assert plan.target_steps == 3
    assert plan.rank_sizes == ((4, 3, 3), (3, 1, 1), (1, 2, 1))
    assert plan.rank_loss_tokens == ((40, 30, 30), (37, 7, 6), (11, 20, 9))
    assert plan.global_samples == (8, 6, 5)
    assert plan.global_loss_tokens == (88, 57, 45)


def test_overflow_keeps_the_first_groups_within_free_slots() -> None:
    plan = plan_round([report([2, 2, 2, 2, 2], free=3), report([3, 1], peels=[4])], join=True)
    assert plan.target_steps == 3
    assert plan.rank_sizes == ((2, 2, 2), (2, 1, 1))


def test_smallest_positive_buffer_caps_the_target() -> None:
    plan = plan_round([report([1, 1, 1, 1]), report([1, 1])], join=True)
    assert plan.target_steps == 2
    assert plan.rank_sizes == ((1, 1), (1, 1))


def test_finished_rank_gets_idle_steps_in_join_mode() -> None:
    done = RankReport(0, 0, False, True, 8, 0, 0)
    plan = plan_round([done, report([2, 1])], join=True)
    assert plan.target_steps == 2
    assert plan.rank_sizes == ((0, 0), (2, 1))
    assert plan.global_samples == (2, 1)
    assert plan.global_loss_tokens == (20, 10)


def test_epoch_ends_when_all_finished_join_or_any_finished_non_join() -> None:
    done = RankReport(0, 0, False, True, 8, 0, 0)
    assert plan_round([done, done], join=True).epoch_over
    assert not plan_round([done, report([1])], join=True).epoch_over
    assert plan_round([done, report([1])], join=False).epoch_over


def test_no_free_slot_on_any_rank_skips_the_round() -> None:
    plan = plan_round([report([2], free=0), report([1])], join=True)
    assert plan.skipped and plan.target_steps == 0 and plan.rank_sizes == ()


def test_out_of_step_and_aborted_ranks_raise() -> None:
    with pytest.raises(AlignmentError, match="rank 1 is at epoch 0 round 1"):
        plan_round([report([1]), report([1], round_index=1)], join=True)
    with pytest.raises(PeerFailedError, match=r"\[1\]"):
        plan_round([report([1]), report([1], aborted=True)], join=True)


def test_aligned_steps_refuses_missing_peel_data() -> None:
    with pytest.raises(AlignmentError):
        aligned_steps(report([3], peels=[]), 2)


@pytest.mark.parametrize("max_steps", [1, 4, 8])
def test_wire_round_trip(max_steps: int) -> None:
    sizes = [3, 2, 1, 5][:max_steps]
    num_peels = max(0, min(sum(sizes), max_steps) - len(sizes))
    original = report(
        sizes,
        peels=[1, 2, 3, 4][:num_peels],
        costs=[90, 80, 70, 60][: len(sizes)],
        peel_costs=[11, 12, 13, 14][:num_peels],
        peel_savings=[30, 30, 20, 40][:num_peels],
    )
    original = replace(
        original,
        undealt=40,
        wanted=7,
        full=False,
        dealt_cost=950,
        dealt_samples=9,
        wait_us=1_500_000,
        elapsed_us=2_000_000,
    )
    message = encode_report(original, max_steps)
    assert len(message) == 15 + 6 * max_steps
    assert decode_report(message, max_steps) == original


def test_steps_are_paired_costliest_first_on_every_rank() -> None:
    # Rank 0 keeps its three groups; rank 1 splits its group of 5 twice (peels cost 9
    # and 8, each lowering the group by 30).
    plan = plan_round(
        [
            report([2, 4, 3], costs=[40, 100, 70]),
            report([5], [50], peels=[7, 6], costs=[150], peel_costs=[9, 8], peel_savings=[30, 30]),
        ],
        join=True,
    )
    assert plan.target_steps == 3
    assert plan.rank_orders == ((1, 2, 0), (0, 1, 2))
    assert plan.rank_costs == ((100, 70, 40), (90, 9, 8))
    assert plan.rank_sizes == ((4, 3, 2), (3, 1, 1))
    assert plan.global_samples == (7, 4, 3)
    assert plan.global_loss_tokens == (40 + 37, 30 + 7, 20 + 6)


def test_cost_order_is_costliest_first_and_stable() -> None:
    assert cost_order([5, 9, 5, 1]) == [1, 0, 2, 3]
    assert cost_order([]) == []


def dealing(wanted: int, cost: int, samples: int, undealt: int) -> RankReport:
    return replace(
        report([], free=8),
        undealt=undealt,
        wanted=wanted,
        full=False,
        dealt_cost=cost,
        dealt_samples=samples,
    )


def test_first_deal_is_half_an_equal_share_of_what_is_left() -> None:
    reports = [dealing(100, 0, 0, 20) for _ in range(3)]
    assert deal_caps(reports) == [4, 4, 4]
    assert deal_counts([replace(r, undealt=2) for r in reports]) == (1, 1, 0), (
        "in rank order while any are left"
    )


def test_deal_levels_the_ranks_work() -> None:
    # 60 samples of mean cost 10 were dealt, 60 are left: each rank's share of the
    # epoch's work is 400. Rank 0 holds 500 (more than its share), rank 1 100 (30
    # samples short), rank 2 nothing (40 short); each gets half of what it lacks, rank 0
    # nothing.
    reports = [dealing(50, 500, 50, 60), dealing(50, 100, 10, 60), dealing(50, 0, 0, 60)]
    assert deal_caps(reports) == [0, 15, 20]
    assert deal_counts(reports) == (0, 15, 20)
    # What a rank wants still bounds its deal, and the deal never exceeds what is left.
    few = [replace(r, wanted=2, undealt=3) for r in reports]
    assert deal_counts(few) == (0, 2, 1)


def test_a_deal_only_round_always_deals() -> None:
    # Rank 1 lacks work but its window is full; rank 0 wants but is above its share.
    # Progress: each rank that wants a sample gets one, so the rounds stay bounded.
    reports = [dealing(5, 10_000, 10, 5), dealing(0, 0, 10, 5), dealing(3, 10_000, 10, 5)]
    assert deal_caps(reports)[0] == 0 and deal_caps(reports)[1] > 0
    assert deal_counts(reports) == (1, 0, 1)
