"""Small epochs at 8 and 64 ranks against the global oracle dealt round robin.

An epoch of ``k`` budgets of work per rank (``k`` = 1, 2, 5, 10; the real sets' lengths,
a seeded sample of ``W x k x budget / mean`` of them in the loader's seeded order) is
dealt by need over ``W`` ranks with the defaults and scored by its utilization
(``core.sync``: the samples' own cost over ``W x`` the sum of the per-step maxima). Its
yardstick is the global oracle dealt round robin: every length of the epoch grouped in
one longest-first packing (``plan_epoch(mode="oracle")``, which needs every length up
front), its batches dealt to the ranks as the planned loader deals them
(``runtime.planned.deal_batches``: in the plan's shuffled order, every ``W``-th to a
rank, the last step's missing ranks IDLE). A stricter column deals the same groups in
cost order (the ``t``-th step takes the ``t``-th ``W`` costliest; no dealing of those
groups pays less). Both are scored under one cost, the token cost (``attention_weight``
0) or a 7B Llama shape's FLOPs (``flop_cost.WEIGHT``; the online epoch and the oracle
are then grouped by that cost too, as a run groups by default).

    python -m experiments.sync_efficiency.small_epochs [--label current] [--worlds 8,64]
        [--lengths LENGTHS.json] [--union-only] [--knobs field=value,...]
    python -m experiments.sync_efficiency.small_epochs --from-results   # README tables

``--union-only`` makes every pooled round group the union (the plan before locality-aware
pooled rounds, ``run.py --union-only``). Each run is stored under its label in
``small_epochs_results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from experiments.common import results_meta
from experiments.scale.shards import draw_lengths
from experiments.sync_efficiency.run import _value, real_lengths
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.runtime.planned import deal_batches

HERE = Path(__file__).resolve().parent
SETS = ("sharegpt_whole", "sharegpt_first_exchange", "chitchat")
BUDGETS = (16384, 49152)
WORK = (1, 2, 5, 10)  # budgets of work per rank
# flop_cost.WEIGHT (attention_weight_of the 7B Llama shape), written out so that this
# script also runs against a library from before core/flops.py.
WEIGHT_7B = 32 * 4096 / (32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096)
COSTS = {"tokens": 0.0, "flops_7b": WEIGHT_7B}


def epoch_of(lengths: list[int], world: int, budget: int, work: int) -> list[int]:
    """``W x work`` budgets of the set's lengths in the loader's seeded order."""
    count = max(world, round(world * work * budget / statistics.fmean(lengths)))
    drawn, _ = draw_lengths(lengths, count, seed=1000 * world + work)
    return [drawn[i] for i in epoch_permutation(len(drawn), 0, 0)]


def oracle_round_robin(ordered: list[int], world: int, config: BatchingConfig) -> dict:
    """The global oracle's batches dealt as the planned loader deals them, and in cost
    order."""
    budget = config.budget
    batches = plan_epoch(ordered, config, mode="oracle")
    useful = sum(budget.row_cost(n) for n in ordered)
    dealt = [deal_batches(batches, world, rank) for rank in range(world)]
    paid = sum(
        max(budget.group_cost([ordered[i] for i in b]) if b else 0.0 for b in column)
        for column in zip(*dealt, strict=True)
    )
    costs = sorted((budget.group_cost([ordered[i] for i in b]) for b in batches), reverse=True)
    steps = math.ceil(len(costs) / world)
    by_cost = sum(costs[t * world] for t in range(steps))  # each step's costliest
    return {
        "oracle_steps_per_rank": steps,
        "oracle_utilization": useful / (world * paid),
        "oracle_by_cost_utilization": useful / (world * by_cost),
    }


def cell(ordered: list[int], world: int, config: BatchingConfig) -> dict:
    started = time.perf_counter()
    result = simulate_dealt_epoch(ordered, world, config)
    elapsed = time.perf_counter() - started
    work = sum(config.budget.row_cost(n) for n in ordered) / (world * config.token_budget)
    row = {
        "world_size": world,
        "token_budget": config.token_budget,
        "samples": len(ordered),
        "budgets_per_rank": work,
        "steps_per_rank": len(result.steps[0]),
        "utilization": result.sync.utilization,
        "moved_samples": sum(result.moved_samples),
        "simulation_s": elapsed,
    }
    row |= oracle_round_robin(ordered, world, config)
    row["over_oracle"] = row["utilization"] - row["oracle_utilization"]
    row["over_oracle_by_cost"] = row["utilization"] - row["oracle_by_cost_utilization"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| set | budget | ranks | cost | budgets / rank | samples | steps / rank "
        "| oracle steps | utilization | oracle dealt | difference | oracle by cost | difference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['token_budget']:,} | {r['world_size']} | {r['cost']} | "
            f"{r['budgets_per_rank']:.1f} | {r['samples']:,} | {r['steps_per_rank']} | "
            f"{r['oracle_steps_per_rank']} | {r['utilization']:.3f} | "
            f"{r['oracle_utilization']:.3f} | {r['over_oracle']:+.3f} | "
            f"{r['oracle_by_cost_utilization']:.3f} | {r['over_oracle_by_cost']:+.3f} |"
        )
    return "\n".join(lines)


def grid(rows: list[dict]) -> str:
    """One line a set, budget, ranks and cost; per budgets of work per rank the
    utilization over the oracle dealt round robin (bold where below it)."""
    lines = [
        "| set | budget | ranks | cost | " + " | ".join(f"{k} / rank" for k in WORK) + " |",
        "|---|---|---|---|" + "---|" * len(WORK),
    ]
    keyed = {(r["set"], r["token_budget"], r["world_size"], r["cost"]): [] for r in rows}
    for r in rows:
        text = f"{r['utilization']:.3f} / {r['oracle_utilization']:.3f}"
        keyed[(r["set"], r["token_budget"], r["world_size"], r["cost"])].append(
            f"**{text}**" if r["over_oracle"] < 0 else text
        )
    for (name, budget, world, cost), cells in keyed.items():
        lines.append(f"| {name} | {budget:,} | {world} | {cost} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(runs: dict) -> str:
    """Per stored run: the cells below the oracle dealt, the worst, and the cells that
    equal the ``defaults`` run's."""
    lines = [
        "| run | cells | below the oracle dealt | worst difference | below the oracle by cost "
        "| worst difference | equal to `defaults` |",
        "|---|---|---|---|---|---|---|",
    ]
    ours = [(r["steps_per_rank"], r["utilization"]) for r in runs["defaults"]["rows"]]
    for label, run in runs.items():
        rows = run["rows"]
        same = sum(ours[i] == (r["steps_per_rank"], r["utilization"]) for i, r in enumerate(rows))
        dealt = [r["over_oracle"] for r in rows]
        by_cost = [r["over_oracle_by_cost"] for r in rows]
        lines.append(
            f"| {label} | {len(rows)} | {sum(d < 0 for d in dealt)} | {min(dealt):+.3f} | "
            f"{sum(d < -0.0005 for d in by_cost)} | {min(by_cost):+.3f} | {same} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="current", help="key of this run in the results")
    parser.add_argument("--worlds", default="8,64")
    parser.add_argument("--lengths", default="", help="the real sets' lengths (set: lengths)")
    parser.add_argument("--union-only", action="store_true", help="see the module docstring")
    parser.add_argument(
        "--knobs", default="", help="batching fields to change, e.g. ramp_budgets=null"
    )
    parser.add_argument(
        "--from-results", action="store_true", help="print the README's tables of the stored runs"
    )
    args = parser.parse_args()
    if args.from_results:
        runs = json.loads((HERE / "small_epochs_results.json").read_text())["runs"]
        print(summary(runs), grid(runs["defaults"]["rows"]), sep="\n\n")
        return
    knobs = {k: _value(v) for k, v in (kv.split("=") for kv in args.knobs.split(",") if kv)}
    if args.union_only:
        import odb_lightning.core.pool_plan as pool_plan

        pool_plan.LEVEL_TOLERANCE = -1.0  # the local plan is never within it
    lengths = json.loads(Path(args.lengths).read_text()) if args.lengths else real_lengths()
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for name in SETS:
            for budget in BUDGETS:
                for work in WORK:
                    ordered = epoch_of(lengths[name], world, budget, work)
                    for cost, weight in COSTS.items():
                        config = BatchingConfig.of(
                            token_budget=budget, attention_weight=weight, **knobs
                        )
                        rows.append({"set": name, "cost": cost} | cell(ordered, world, config))
                        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    import odb_lightning

    path = HERE / "small_epochs_results.json"
    stored = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    meta = results_meta() | {"library": str(Path(odb_lightning.__file__).parent)}
    stored["runs"][args.label] = {"meta": meta, "rows": rows}
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
