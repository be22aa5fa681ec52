"""Planning cost of ours against the reference package's grouping: one harness, CPU time,
the same shards.

    .venv/bin/python -m experiments.planner_cost.compare --worlds 1,8,64 --repeats 3

Per set and world size (the real sets of ``experiments.sync_efficiency``, dealt the same
way), both planners run one epoch for every rank of the job in this process:

* **ours**: ``core.simulate.simulate_dealt_epoch`` at the default settings (every rank's
  window grouping, its report encoded and decoded, the plan, the steps applied), less
  the scoring it ends with (``sync_figures``, timed again on the same steps and
  subtracted);
* **reference**: ``online-dynamic-batching==0.1.2``'s own ``odb.grouping.grouping_data``
  driven as its collate loop drives it (``experiments.sync_efficiency.reference``), one
  thread per rank, its all-gather served in memory. Its input samples are built before the
  clock (a stride-0 ``input_ids`` view: it reads only the size), so the timed region is
  its grouping and nothing else.

The clock is ``time.process_time`` (CPU time of every thread of this process), so the
other jobs on the machine weigh less; figures are medians of ``--repeats``. Reported: CPU
ms per step position of the job (every rank's work for one step) and CPU us per sample;
their ratio reference / ours (above 1: ours is cheaper). Writes ``compare.json`` here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from experiments.common import results_meta
from experiments.sync_efficiency.reference import measure_reference
from experiments.sync_efficiency.run import CASES, epoch_lengths, real_lengths, shards_of
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.core.sync import sync_figures

HERE = Path(__file__).resolve().parent


def ours_cpu_s(ordered: list[int], world: int, config: BatchingConfig) -> tuple[float, int]:
    """CPU seconds of our planning for one epoch of ``world`` ranks, and steps per rank."""
    start = time.process_time()
    result = simulate_dealt_epoch(ordered, world, config)
    total = time.process_time() - start
    start = time.process_time()
    sync_figures([[s.group for s in rank] for rank in result.steps], config.budget)
    scoring = time.process_time() - start
    return total - scoring, len(result.steps[0])


def measure_case(name: str, lengths: list[int], budget: int, world: int, repeats: int) -> dict:
    ordered = epoch_lengths(lengths, world)
    config = replace(BatchingConfig.of(), token_budget=budget)
    ours, reference = [], []
    steps = reference_steps = 0
    for _ in range(repeats):
        cpu_s, steps = ours_cpu_s(ordered, world, config)
        ours.append(cpu_s)
        row = measure_reference(shards_of(ordered, world), budget, buffer_size=256)
        reference.append(row["planning_cpu_s"])
        reference_steps = row["steps_per_rank"]
    ours_s, reference_s = statistics.median(ours), statistics.median(reference)
    samples = len(ordered)
    return {
        "set": name,
        "token_budget": budget,
        "world_size": world,
        "samples": samples,
        "ours_steps_per_rank": steps,
        "reference_steps_per_rank": reference_steps,
        "ours_cpu_s": ours,
        "reference_cpu_s": reference,
        "ours_ms_per_step": 1e3 * ours_s / steps,
        "reference_ms_per_step": 1e3 * reference_s / reference_steps,
        "ours_us_per_sample": 1e6 * ours_s / samples,
        "reference_us_per_sample": 1e6 * reference_s / samples,
        "reference_over_ours_per_step": (reference_s / reference_steps) / (ours_s / steps),
        "reference_over_ours_per_sample": reference_s / ours_s,
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| set | budget | ranks | samples | ours ms / step | reference ms / step | "
        "ref / ours per step | ours us / sample | reference us / sample | ref / ours per sample |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['token_budget']:,} | {r['world_size']} | {r['samples']:,} | "
            f"{r['ours_ms_per_step']:.3f} | {r['reference_ms_per_step']:.3f} | "
            f"{r['reference_over_ours_per_step']:.2f} | {r['ours_us_per_sample']:.1f} | "
            f"{r['reference_us_per_sample']:.1f} | {r['reference_over_ours_per_sample']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="1,8,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sets", default="", help="only these sets (comma-separated)")
    parser.add_argument("--out", type=Path, default=HERE / "compare.json")
    args = parser.parse_args()
    lengths = real_lengths()
    cases = [c for c in CASES if not args.sets or c[0] in args.sets.split(",")]
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for name, budget in cases:
            rows.append(measure_case(name, lengths[name], budget, world, args.repeats))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    args.out.write_text(
        json.dumps({"meta": results_meta(repeats=args.repeats), "rows": rows}, indent=2) + "\n"
    )
    print(markdown(rows))


if __name__ == "__main__":
    main()
