"""One slow rank: dealing by work against dealing that sees fetch time, on real ranks.

Two Gloo ranks run one epoch of 120 synthetic samples (the harness's
``SyntheticChatDataset``, lengths 2-299, token budget 1,024, two workers per rank), dealt
by need from one order. Rank 1's ``dataset[i]`` sleeps 0.15 s (a slow file system);
rank 0's returns at once. Arms: ``defaults`` (dealing that sees fetch time, on by
default with ``shard_dealing=by_need``, and the defaults' grouping across ranks, which
sends no work toward a rank that is behind) and ``by_work``
(``batching.policy.fetch_aware_dealing=false``: the deal levels the ranks' work), and the
same two with ``cross_rank_grouping=false`` (``*_per_rank``: each rank runs what it
fetched), alternated ``--repeats`` times in one run. Per run: the samples each rank
fetched and ran, each rank's epoch wall time (first batch requested to the last one),
the epoch's time (the later rank's), and that every sample ran exactly once. Figures are
medians over the repeats.

    python -m experiments.slow_rank.run [--repeats 3] [--delay 0.15]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from experiments.common import results_meta
from testing.harness.datasets import SyntheticChatDataset
from testing.harness.ranks import RankJob, run_ranks

HERE = Path(__file__).resolve().parent
SAMPLES = 120
LOADER = {
    "token_budget": 1024,
    "num_workers": 2,
    "shard_dealing": "by_need",
    "multiprocessing_context": "fork",
}
ARMS = {
    "defaults": {},
    "by_work": {"fetch_aware_dealing": False},
    "by_work_per_rank": {"fetch_aware_dealing": False, "cross_rank_grouping": False},
    "fetch_aware_per_rank": {"cross_rank_grouping": False},
}


def run_once(arm: str, delay_s: float) -> dict:
    job = RankJob(
        SyntheticChatDataset.seeded(SAMPLES),
        {**LOADER, **ARMS[arm]},
        rank_delays={1: delay_s},
    )
    outcome = run_ranks(job, world_size=2, timeout_s=600)
    if outcome.errors:
        raise RuntimeError(f"{arm}: {outcome.errors}")
    runs = [outcome.ok[rank][0] for rank in range(2)]
    ran = Counter(i for run in runs for step in run["steps"] for i in step["meta"].sample_ids)
    once = sorted(ran) == list(range(SAMPLES)) and set(ran.values()) == {1}
    return {
        "arm": arm,
        "samples_per_rank": [run["stats"].emitted_samples for run in runs],
        "fetched_per_rank": [run["stats"].fetched_samples for run in runs],
        "steps_per_rank": [len(run["steps"]) for run in runs],
        "idle_steps_per_rank": [run["stats"].idle_steps for run in runs],
        "wall_s_per_rank": [run["wall_s"] for run in runs],
        "epoch_s": max(run["wall_s"] for run in runs),
        "every_sample_once": once,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.15, help="rank 1's seconds a sample")
    args = parser.parse_args()
    runs = []
    for repeat in range(args.repeats):
        for arm in ARMS:
            runs.append(run_once(arm, args.delay) | {"repeat": repeat})
            r = runs[-1]
            print(
                f"{arm:20s} fetched {r['fetched_per_rank']} ran {r['samples_per_rank']} "
                f"steps {r['steps_per_rank']} "
                f"epoch {r['epoch_s']:.2f} s once {r['every_sample_once']}",
                flush=True,
            )
    summary = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {
            "median_epoch_s": statistics.median(r["epoch_s"] for r in mine),
            "median_samples_per_rank": [
                statistics.median(r["samples_per_rank"][k] for r in mine) for k in range(2)
            ],
            "median_fetched_per_rank": [
                statistics.median(r["fetched_per_rank"][k] for r in mine) for k in range(2)
            ],
            "every_sample_once": all(r["every_sample_once"] for r in mine),
        }
    for aware, by_work in (("defaults", "by_work"), ("fetch_aware_per_rank", "by_work_per_rank")):
        summary[f"epoch_time_ratio_{aware}"] = (
            summary[aware]["median_epoch_s"] / summary[by_work]["median_epoch_s"]
        )
    out = {"meta": results_meta(), "delay_s": args.delay, "runs": runs, "summary": summary}
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
