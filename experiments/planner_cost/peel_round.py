"""The cost of one round whose step cap reaches the window: CPU time of
``GroupingWindow.make_report`` (grouping, split/overflow figures) and of the plan's
``aligned_steps`` for one rank holding ``N`` samples with ``max_steps_per_round = N``, so
nearly every sample is peeled into a singleton step.

    .venv/bin/python -m experiments.planner_cost.peel_round --samples 1024,2048,4096,8192

Prints, per ``N``, the median and the spread of ``--repeats`` CPU times (process time, so
other jobs on the machine weigh less) and the time per sample; a path linear in the
window keeps the time per sample flat as ``N`` doubles.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from odb_lightning.core.alignment import aligned_steps
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.types import SampleInfo
from odb_lightning.core.window import GroupingWindow


def full_window(samples: int, seed: int = 0) -> GroupingWindow:
    """One rank's window holding ``samples`` ShareGPT-like lengths (16-2,048 tokens,
    most short) under a 16,384-token budget, the cap at the window size, no ramp."""
    policy = OnlinePolicy(
        outstanding_depth=samples,
        window_budgets=None,
        ramp_budgets=None,
        max_steps_per_round=samples,
        shard_dealing="fixed",
    )
    config = BatchingConfig(token_budget=16384, policy=policy)
    window = GroupingWindow(config, samples)
    rng = random.Random(seed)
    positions = window.request()
    for position in positions:
        length = min(2048, max(16, int(rng.lognormvariate(5.5, 1.0))))
        window.add(SampleInfo(position, length, length // 2, position=position))
    return window


def time_round(samples: int) -> float:
    """CPU seconds of the report and of the aligned steps of one full round."""
    window = full_window(samples)
    start = time.process_time()
    report = window.make_report()
    aligned_steps(report, report.free_slots)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="1024,2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = []
    for samples in (int(n) for n in args.samples.split(",")):
        times = [time_round(samples) for _ in range(args.repeats)]
        median = statistics.median(times)
        rows.append(
            {
                "samples": samples,
                "median_ms": round(median * 1e3, 2),
                "min_ms": round(min(times) * 1e3, 2),
                "max_ms": round(max(times) * 1e3, 2),
                "us_per_sample": round(median * 1e6 / samples, 2),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| samples | median ms | min-max ms | us per sample |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['samples']:,} | {row['median_ms']} | {row['min_ms']}-{row['max_ms']} "
            f"| {row['us_per_sample']} |"
        )


if __name__ == "__main__":
    main()
