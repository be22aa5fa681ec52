"""Sync efficiency and utilization: by hand, from the simulator, and in the run summary."""

from __future__ import annotations

import pytest

from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.rows import PaddedRows
from odb_lightning.core.simulate import simulate_epoch
from odb_lightning.core.sync import group_cost, sync_figures
from odb_lightning.core.types import Group, SampleInfo
from odb_lightning.lit.callbacks.counters import RankTotals
from odb_lightning.lit.callbacks.summary import summary_sync_figures
from odb_lightning.runtime.batch import make_step_meta


def group(*lengths: int) -> Group:
    return Group(tuple(SampleInfo(i, n, 0, i) for i, n in enumerate(lengths)))


def test_figures_by_hand() -> None:
    budget = Budget(100)
    # Step 0: 4 x 25 = 100 beside 2 x 25 = 50; step 1: 90 beside an IDLE step.
    rank0 = [group(25, 20, 20, 10), group(90)]
    rank1 = [group(25, 25), None]
    figures = sync_figures([rank0, rank1], budget)
    assert figures.sync_efficiency == pytest.approx(((100 + 50) / 200 + 90 / 180) / 2)
    assert figures.max_cost_sum == 190
    assert figures.useful_cost_sum == 75 + 90 + 50
    assert figures.utilization == pytest.approx(215 / (2 * 190))
    assert figures.idle_fraction == 0.25
    with pytest.raises(ValueError, match="different step counts"):
        sync_figures([rank0, rank1[:1]], budget)


def test_cost_model_is_the_budgets() -> None:
    budget = Budget(1000, attention_weight=0.01)
    assert group_cost(group(10, 5), budget) == budget.cost(2, 10) == 2 * (10 + 0.01 * 100)
    assert group_cost(None, budget) == 0


def test_summary_figures_equal_the_simulators() -> None:
    lengths = lognormal_lengths(1200, 700.0, 0.9, seed=2, max_len=4096)
    config = BatchingConfig.of(token_budget=8192, window_budgets=8)
    result = simulate_epoch([lengths[r::3] for r in range(3)], config)
    totals = [RankTotals() for _ in range(3)]
    for rank, steps in enumerate(result.steps):
        for index, step in enumerate(steps):
            totals[rank].add(
                make_step_meta(step, step_index=index, epoch=0, rows=PaddedRows()), 0.0
            )
    figures = summary_sync_figures(totals)
    # The plan's costs are whole tokens, as are the simulator's with attention_weight 0.
    assert figures["sync_efficiency"] == pytest.approx(result.sync.sync_efficiency)
    assert figures["utilization"] == pytest.approx(result.sync.utilization)
    assert 0.5 < figures["utilization"] < figures["sync_efficiency"] < 1


def test_grouped_counts_the_planners_work() -> None:
    lengths = [[(i * 37) % 500 + 20 for i in range(300)]]
    # Without the ramp (whose rounds emit a few steps each), a round that may emit every
    # group of the window groups each sample once.
    drained = simulate_epoch(
        lengths, BatchingConfig.of(token_budget=2000, max_steps_per_round=512, ramp_budgets=None)
    )
    assert drained.grouped == [300]
    # Two steps a round regroup what the window kept: each sample is grouped many times.
    kept = simulate_epoch(
        lengths, BatchingConfig.of(token_budget=2000, window_budgets=16, max_steps_per_round=2)
    )
    assert kept.grouped[0] > 3 * 300
