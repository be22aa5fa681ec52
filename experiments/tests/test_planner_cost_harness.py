"""The planner-cost harness drives the reference package's grouping on prebuilt inputs:
every sample emitted once, both planners timed in CPU time on the same shards."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("odb")  # the comparator, installed with the test extra

from experiments.planner_cost.compare import markdown, ours_cpu_s  # noqa: E402
from experiments.sync_efficiency.reference import _samples, measure_reference  # noqa: E402
from odb_lightning.core.config import BatchingConfig  # noqa: E402


def test_the_reference_groups_prebuilt_samples_that_hold_no_tokens() -> None:
    lengths = [17, 4000, 250]
    (first, second, third) = _samples(lengths)
    # A stride-0 view: the size the package reads, one element of storage.
    assert [s[0]["input_ids"].shape[0] for s in (first, second, third)] == lengths
    assert second[0]["input_ids"].untyped_storage().nbytes() == 8


def test_both_planners_run_one_epoch_of_the_same_shards_in_cpu_time() -> None:
    rng = random.Random(0)
    ordered = [min(4096, max(8, int(rng.lognormvariate(6.0, 0.9)))) for _ in range(600)]
    shards = [ordered[rank::2] for rank in range(2)]
    row = measure_reference(shards, 16384, buffer_size=256)
    assert row["not_emitted"] == 0 and row["left_in_buffers"] == 0
    assert row["planning_cpu_s"] > 0
    cpu_s, steps = ours_cpu_s(ordered, 2, BatchingConfig.of(token_budget=16384))
    assert cpu_s > 0 and steps > 0
    table = markdown(
        [
            {
                "set": "s", "token_budget": 16384, "world_size": 2, "samples": 600,
                "ours_ms_per_step": 0.2, "reference_ms_per_step": 0.1,
                "reference_over_ours_per_step": 0.5, "ours_us_per_sample": 9.0,
                "reference_us_per_sample": 5.0, "reference_over_ours_per_sample": 0.56,
            }
        ]
    )  # fmt: skip
    assert (
        table.splitlines()[-1]
        == "| s | 16,384 | 2 | 600 | 0.200 | 0.100 | 0.50 | 9.0 | 5.0 | 0.56 |"
    )
