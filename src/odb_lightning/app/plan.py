"""``odb-plan``: compare batching modes on a length distribution, offline.

Reads token lengths (a file, a synthetic lognormal profile, or a data source), plans one
epoch per batching mode and token budget, and prints steps per epoch, batch sizes, padding
efficiency and budget fill, plus the bucket table (range, count, mean length, batch size,
efficiency) for ``bucketed``::

    odb-plan --synthetic 1456,0.54,17545 --budget 16384,49152
    odb-plan --source jsonl --path my_chats.jsonl --tokenizer /models/Qwen2.5-0.5B
    python -m odb_lightning.app.plan --lengths lengths.npy --modes sorted,bucketed --json

The batching options set fields of the batching configuration (:data:`KNOB_OPTIONS`):
their types, defaults and choices come from those dataclass fields, and each mode gets
the options of its own policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

from rich.console import Console

from odb_lightning.app.plan_inputs import SOURCES, PlanCliError, describe, load_lengths
from odb_lightning.app.plan_tables import render
from odb_lightning.core.buckets import bucket_table, optimize_boundaries, predict_efficiency
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.modes import MODES, Mode
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.plans import summarize_plan
from odb_lightning.core.policy import BucketedPolicy, SortedPolicy, StandardPolicy
from odb_lightning.core.simulate import SimulationResult, simulate_dealt_epoch, simulate_epoch
from odb_lightning.data.formats import FORMATS
from odb_lightning.runtime.transport import TEXT_WIRE_BYTES_PER_TOKEN

DEFAULT_BUDGET = 16384


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _synthetic(text: str) -> tuple[float, float, int]:
    parts = text.split(",")
    try:
        mean, cv, n = float(parts[0]), float(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"expected MEAN,CV,N (e.g. 1456,0.54,17545), got {text!r}"
        ) from None
    if len(parts) != 3 or not (mean > 0 and cv >= 0 and n > 0):
        raise argparse.ArgumentTypeError(f"need MEAN > 0, CV >= 0, N > 0, got {text!r}")
    return mean, cv, n


def _modes(text: str) -> list[Mode]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not set(names) <= set(MODES):
        valid = ",".join(MODES)
        raise argparse.ArgumentTypeError(f"modes must be among {valid}, got {text!r}")
    return [MODES[name] for name in names]


@dataclasses.dataclass(frozen=True)
class KnobOption:
    """A command-line option that sets the field ``knob`` of the policies ``policies``."""

    flag: str
    knob: str
    policies: tuple[type, ...]
    help: str
    from_config: bool = False
    """No default of its own: unset, the policy's field default applies (shown so)."""

    def field(self) -> dataclasses.Field:
        return next(f for f in dataclasses.fields(self.policies[0]) if f.name == self.knob)

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        field = self.field()
        default = field.default
        if isinstance(default, bool):
            parser.add_argument(self.flag, dest=self.knob, action="store_true", help=self.help)
            return
        if default is None and "bool" in str(field.type):  # on, off, or where it applies
            parser.add_argument(
                self.flag,
                dest=self.knob,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{self.help} (default: where it applies)",
            )
            return
        choices = [m.value for m in type(default)] if isinstance(default, Enum) else None
        if isinstance(default, tuple):
            parse: Callable[[str], object] = _int_list
        else:
            parse = str if choices else (float if isinstance(default, float) else int)
        shown = f"default: the config's, {getattr(default, 'value', default)}"
        parser.add_argument(
            self.flag,
            dest=self.knob,
            type=parse,
            choices=choices,
            default=None if self.from_config or isinstance(default, tuple) else default,
            help=f"{self.help} ({shown})" if self.from_config else self.help,
        )


KNOB_OPTIONS = (
    KnobOption("--batch-size", "batch_size", (StandardPolicy, SortedPolicy), "standard/sorted"),
    KnobOption("--window", "outstanding_depth", (OnlinePolicy,), "odb window cap D", True),
    KnobOption(
        "--window-budgets",
        "window_budgets",
        (OnlinePolicy,),
        "odb window in token budgets of work (0: D samples)",
        True,
    ),  # fmt: skip
    KnobOption("--dealing", "shard_dealing", (OnlinePolicy,), "shards for --ranks", True),
    KnobOption(
        "--cross-rank",
        "cross_rank_grouping",
        (OnlinePolicy,),
        "--ranks: group the tail, the ramp and uneven rounds across ranks",
    ),
    KnobOption(
        "--pool-below-sync",
        "pool_below_sync",
        (OnlinePolicy,),
        "--cross-rank: pool rounds whose sync efficiency would be below this (1.0: every round)",
    ),
    KnobOption("--buckets", "num_buckets", (BucketedPolicy,), "k for the bucket optimizer"),
    KnobOption("--boundaries", "boundaries", (BucketedPolicy,), "fixed bucket edges, no optimizer"),
    KnobOption("--max-batch-size", "max_batch_size", (BucketedPolicy,), "bucketed batch cap"),
)
"""The batching options: each sets one field of the policies it names, nowhere else."""


def _knobs(args: argparse.Namespace, policy: type) -> dict[str, Any]:
    """The options given for ``policy``'s fields (``--window-budgets 0``: no work cap)."""
    knobs = {
        option.knob: getattr(args, option.knob)
        for option in KNOB_OPTIONS
        if policy in option.policies and getattr(args, option.knob) is not None
    }
    if knobs.get("window_budgets") == 0:
        knobs["window_budgets"] = None
    return knobs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odb-plan", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths",
        type=Path,
        help="sample lengths: a length cache (lengths-*.arrow), .npy, or text with one int per "
        "sample",
    )
    source.add_argument(
        "--synthetic", type=_synthetic, metavar="MEAN,CV,N",
        help="N lognormal lengths of mean MEAN tokens and coefficient of variation CV",
    )  # fmt: skip
    source.add_argument(
        "--source", choices=SOURCES,
        help="tokenize a data source with the chat template (ultrachat and jsonl need --path)",
    )  # fmt: skip
    source.add_argument(
        "--mixture", nargs="+", metavar="PATH[:WEIGHT]",
        help="a mixture of your files (train.py's data.mixture), each with its weight "
        "(default 1), chosen as training chooses them (--seed, --max-samples caps the mix)",
    )  # fmt: skip
    parser.add_argument(
        "--path",
        help="--source ultrachat: parquet file/dir or hub name; jsonl: your files (JSON "
        "Lines, a JSON array, parquet, a folder or glob, a save_to_disk folder)",
    )
    parser.add_argument(
        "--format", default="auto", choices=["auto", *FORMATS],
        help="--source jsonl: the records' layout (data.source.format; auto: detected)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default="qwen2.5", help="--source: qwen2.5 or a Hugging Face directory"
    )
    parser.add_argument(
        "--template", default="auto", help="--source: chat template (data.source.template)"
    )
    parser.add_argument(
        "--record-cache-dir", metavar="DIR",
        help="--source: convert the records once into a memory-mapped table here and read "
        "them from it (train.py's data.caches.record_dir, default "
        "<project>/.cache/odb_lightning/records, shares it); default: odb_lightning/records "
        "in the datasets cache",
    )  # fmt: skip
    parser.add_argument(
        "--skip-bad-records", action="store_true",
        help="--source jsonl: skip lines that are not a conversation (counted), as "
        "batching.loader.on_bad_sample=skip does in training",
    )  # fmt: skip
    parser.add_argument("--max-seq-len", type=int, help="truncate lengths to this many tokens")
    parser.add_argument("--max-samples", type=int, help="first N samples of --source")
    parser.add_argument(
        "--budget", type=_int_list, action="append", metavar="TOKENS[,TOKENS...]",
        help=f"token budget(s) per step, comma-separated or repeated (default {DEFAULT_BUDGET})",
    )  # fmt: skip
    parser.add_argument(
        "--modes", type=_modes, default=_modes("standard,sorted,bucketed,oracle,odb"),
        metavar="MODE[,MODE...]",
        help="batching modes to plan, among " + ",".join(MODES)
        + " (default standard,sorted,bucketed,oracle,odb)",
    )  # fmt: skip
    parser.add_argument(
        "--ranks", type=int, default=None,
        help="also simulate odb over N ranks: sync efficiency, utilization, steps/oracle",
    )  # fmt: skip
    for option in KNOB_OPTIONS:
        option.add_to(parser)
    parser.add_argument("--seed", type=int, default=BatchingConfig().seed)
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return parser


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
        knobs = _knobs(args, mode.policy)
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
    knobs = _knobs(args, OnlinePolicy)
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
