"""The cost of planning one pooled round (grouping across ranks): CPU time of
``core.pool_plan.plan_pool`` over the union of ``W`` windows of ``N`` samples each, capped
at ``Q = 128`` step positions as a full round is. Every rank computes this plan, so it is
the round's extra latency; ``core.pooling.MAX_POOL_SAMPLES`` bounds the union.

    .venv/bin/python -m experiments.planner_cost.pool_plan --shapes 8x2048,64x1400,128x2048,1024x512

Lengths: the ShareGPT whole profile (lognormal, mean 1,456, CV 0.54, at most 4,096)
under a 16,384-token budget. Prints, per shape, the median and spread of ``--repeats``
CPU times (process time) and the time per sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.pool_plan import plan_pool
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.types import SampleInfo

POSITIONS = 128


def offers(world: int, per_rank: int, seed: int = 0) -> list[list[SampleInfo]]:
    """``world`` windows of ``per_rank`` samples, positions numbered across them."""
    lengths = lognormal_lengths(world * per_rank, 1456.0, 0.54, seed=seed, max_len=4096)
    return [
        [
            SampleInfo(sample_id=i, length=lengths[i], num_loss_tokens=lengths[i], position=i)
            for i in range(rank * per_rank, (rank + 1) * per_rank)
        ]
        for rank in range(world)
    ]


def measure(world: int, per_rank: int, repeats: int) -> dict:
    offered = offers(world, per_rank)
    budget = BatchingConfig.of(token_budget=16384).budget
    times = []
    for _ in range(repeats):
        started = time.process_time()
        plan_pool(offered, budget, positions=POSITIONS)
        times.append(time.process_time() - started)
    samples = world * per_rank
    median = statistics.median(times)
    return {
        "ranks": world,
        "samples_per_rank": per_rank,
        "samples": samples,
        "median_s": median,
        "min_s": min(times),
        "max_s": max(times),
        "us_per_sample": 1e6 * median / samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x2048,64x1400,128x2048,1024x512")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        world, per_rank = (int(x) for x in shape.split("x"))
        row = measure(world, per_rank, args.repeats)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
