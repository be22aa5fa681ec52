"""``odb-plan``: compare batching modes on a length distribution, offline.

Reads token lengths (a file, a synthetic lognormal profile, or a data source), plans one
epoch per batching mode and token budget, and prints steps per epoch, batch sizes, padding
efficiency and budget fill, plus the bucket table (range, count, mean length, batch size,
efficiency) for ``bucketed``::

    odb-plan --synthetic 1456,0.54,17545 --budget 16384,49152
    odb-plan --source jsonl --path my_chats.jsonl --tokenizer /models/Qwen2.5-0.5B
    python -m odb_lightning.app.plan --lengths lengths.npy --modes sorted,bucketed --json

Its options are :mod:`odb_lightning.app.plan_args`'s; the batching options set fields of
the batching configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any

from rich.console import Console

from odb_lightning.app.plan_args import DEFAULT_BUDGET, build_parser, knobs_of
from odb_lightning.app.plan_inputs import PlanCliError, describe, load_lengths
from odb_lightning.app.plan_tables import render
from odb_lightning.core.buckets import bucket_table, optimize_boundaries, predict_efficiency
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.plans import summarize_plan
from odb_lightning.core.policy import BucketedPolicy
from odb_lightning.core.simulate import SimulationResult, simulate_dealt_epoch, simulate_epoch
from odb_lightning.runtime.transport import TEXT_WIRE_BYTES_PER_TOKEN


def _bucket_report(lengths: list[int], budget: int, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    boundaries = args.boundaries or optimize_boundaries(
        lengths, args.num_buckets, token_budget=budget, max_batch_size=args.max_batch_size
    )
    optimizer_s = 0.0 if args.boundaries else time.perf_counter() - start
    kwargs = {"token_budget": budget, "max_batch_size": args.max_batch_size}
    rows = bucket_table(lengths, boundaries, seed=args.seed, **kwargs)
    return {
        "boundaries": boundaries,
        "optimized": not args.boundaries,
        "optimizer_s": optimizer_s,
        "predicted_efficiency": predict_efficiency(lengths, boundaries, **kwargs),
        "table": [dataclasses.asdict(row) for row in rows],
    }


FEW_BUDGETS = 16
"""An epoch of fewer budgets than this is small for its budget: each step spans much of
the length range, so no grouping under the budget pads little."""


def budget_advice(lengths: list[int], budget: int) -> str | None:
    """A sentence when the lengths hold fewer than :data:`FEW_BUDGETS` budgets of
    ``budget``: what that does to the budget-packed modes, and a budget to plan with that
    gives the file about 32 steps (a power of two, at least its longest sample)."""
    total = sum(lengths)
    if not lengths or total >= FEW_BUDGETS * budget:
        return None
    per_step = len(lengths) * budget / total
    longest = 2 ** math.ceil(math.log2(max(lengths)))  # a sample must fit one step
    suggested = max(2 ** round(math.log2(max(total / 32, 1))), longest)
    if suggested >= budget:
        return None
    return (
        f"the budget is large for these lengths: {total:,} tokens are {total / budget:.1f} "
        f"budgets of {budget:,}, about {per_step:.0f} samples a step, so each step spans "
        f"much of the length range and the modes that fill the budget (odb, oracle, "
        f"bucketed) pad more than fixed batches of sorted lengths; --budget {suggested} "
        f"plans about 32 steps, as a larger file would fill this budget"
    )


def evaluate_budget(lengths: list[int], budget: int, args: argparse.Namespace) -> dict[str, Any]:
    """Plan epoch 0 in every requested mode under one budget; stats as plain dicts."""
    report: dict[str, Any] = {"token_budget": budget, "modes": {}}
    if any(mode.policy is BucketedPolicy for mode in args.modes):
        report["buckets"] = _bucket_report(lengths, budget, args)
    for mode in args.modes:
        knobs = knobs_of(args, mode.policy)
        if mode.policy is BucketedPolicy:
            knobs["boundaries"] = tuple(report["buckets"]["boundaries"])
        config = BatchingConfig.of(mode=mode.name, token_budget=budget, seed=args.seed, **knobs)
        batches = plan_epoch(lengths, config)
        stats = summarize_plan(lengths, batches, budget, rows=config.rows)
        report["modes"][mode.name] = dataclasses.asdict(stats)
    if args.ranks:
        report["ranks"] = evaluate_ranks(lengths, budget, args)
    report["comparison"] = {
        name: report["modes"][name]["padding_efficiency"]
        for name in ("sorted", "standard", "bucketed")
        if name in report["modes"]
    }
    report["advice"] = budget_advice(lengths, budget)
    return report


def evaluate_ranks(lengths: list[int], budget: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``odb`` epoch simulated over ``--ranks`` ranks, dealt as the loader deals the
    epoch's seeded order, scored by its slowest rank (:mod:`odb_lightning.core.sync`)."""
    if args.ranks < 1:
        raise PlanCliError(f"--ranks must be >= 1, got {args.ranks}")
    knobs = knobs_of(args, OnlinePolicy)
    config = BatchingConfig.of(mode="odb", token_budget=budget, seed=args.seed, **knobs)
    policy: OnlinePolicy = config.policy  # type: ignore[assignment]
    ordered = [lengths[i] for i in epoch_permutation(len(lengths), args.seed, 0)]
    world = args.ranks
    if policy.by_need:
        # A byte a token: the moved "bytes" count the moved samples' tokens.
        result = simulate_dealt_epoch(ordered, world, config, sample_bytes=ordered)
    else:
        result = simulate_epoch([ordered[r::world] for r in range(world)], config)
    oracle = len(plan_epoch(lengths, mode="oracle", token_budget=budget)) / world
    steps = len(result.steps[0])
    return {
        "world_size": world,
        "shard_dealing": policy.shard_dealing.value,
        "window_budgets": policy.window_budgets,
        "outstanding_depth": policy.outstanding_depth,
        "rounds": result.rounds,
        "steps_per_rank": steps,
        "steps_vs_oracle": steps / oracle,
        "sync_efficiency": result.sync.sync_efficiency,
        "utilization": result.sync.utilization,
        "idle_fraction": result.sync.idle_fraction,
        "cross_rank_grouping": policy.groups_across_ranks,
        "pool_below_sync": policy.pool_below_sync,
        "moved_samples": sum(result.moved_samples),
        **_moved_per_rank_step(result, steps),
    }


def _moved_per_rank_step(result: SimulationResult, steps: int) -> dict[str, float]:
    """The samples that run on a rank that did not fetch them, per rank step: count,
    tokens (the simulation counted a byte a token), and the bytes a text sample takes on
    the wire at :data:`~odb_lightning.runtime.transport.TEXT_WIRE_BYTES_PER_TOKEN` (an
    estimate: a run's ``summary.json`` counts the real bytes)."""
    rank_steps = max(1, steps * len(result.steps))
    tokens = sum(result.moved_bytes)
    return {
        "moved_samples_per_rank_step": sum(result.moved_samples) / rank_steps,
        "moved_tokens_per_rank_step": tokens / rank_steps,
        "moved_wire_bytes_per_rank_step": TEXT_WIRE_BYTES_PER_TOKEN * tokens / rank_steps,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``odb-plan``; returns the exit status."""
    args = build_parser().parse_args(argv)
    budgets = [b for group in (args.budget or [[DEFAULT_BUDGET]]) for b in group]
    try:
        lengths, origin = load_lengths(args)
        result = {
            "lengths": describe(lengths, origin),
            "settings": {
                "batch_size": args.batch_size,
                "window": args.outstanding_depth,
                "window_budgets": args.window_budgets,
                "ranks": args.ranks,
                "buckets": args.num_buckets,
                "max_batch_size": args.max_batch_size,
                "seed": args.seed,
                "modes": [m.name for m in args.modes],
            },
            "budgets": [evaluate_budget(lengths, budget, args) for budget in budgets],
        }
    except (PlanCliError, ValueError) as error:
        print(f"odb-plan: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result, sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        render(result, Console())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
