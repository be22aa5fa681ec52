"""``odb-plan``: compare batching modes on a length distribution, offline.

Reads token lengths (a file, a synthetic lognormal profile, or a data source), plans one
epoch per batching mode and token budget, and prints steps per epoch, batch sizes, padding
efficiency and budget fill, plus the bucket table (range, count, mean length, batch size,
efficiency) for ``bucketed``::

    odb-plan --synthetic 1456,0.54,17545 --budget 16384,49152
    odb-plan --source jsonl --path my_chats.jsonl --tokenizer /models/Qwen2.5-0.5B
    python -m odb_lightning.plan --lengths lengths.npy --modes sorted,bucketed --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from odb_lightning.core.buckets import bucket_table, optimize_boundaries, predict_efficiency
from odb_lightning.core.config import BatchingConfig, BatchingMode, ShardDealing
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch, summarize_plan, validate_lengths
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch, simulate_epoch

DEFAULT_BUDGET = 16384

SOURCES = ("sharegpt", "chitchat", "ultrachat", "jsonl", "synthetic")
"""``--source`` names: :class:`~odb_lightning.data.sources.SourceName` and ``synthetic``
(spelled here so that ``--help`` needs no data layer; a test keeps them equal)."""
SOURCES_WITH_PATH = ("ultrachat", "jsonl")


class PlanCliError(Exception):
    """Bad input the user can fix; printed without a traceback."""


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


def _modes(text: str) -> list[BatchingMode]:
    try:
        return [BatchingMode(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        valid = ",".join(m.value for m in BatchingMode)
        raise argparse.ArgumentTypeError(f"modes must be among {valid}, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odb-plan", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths", type=Path, help="sample lengths: .npy, or text with one int per sample"
    )
    source.add_argument(
        "--synthetic", type=_synthetic, metavar="MEAN,CV,N",
        help="N lognormal lengths of mean MEAN tokens and coefficient of variation CV",
    )  # fmt: skip
    source.add_argument(
        "--source", choices=SOURCES,
        help="tokenize a data source with the chat template (ultrachat and jsonl need --path)",
    )  # fmt: skip
    parser.add_argument(
        "--path", help="--source ultrachat: parquet file/dir or hub name; jsonl: the file"
    )
    parser.add_argument(
        "--tokenizer", default="qwen2.5", help="--source: qwen2.5 or a Hugging Face directory"
    )
    parser.add_argument(
        "--template", default="auto", help="--source: chat template (data.template)"
    )
    parser.add_argument(
        "--skip-bad-records", action="store_true",
        help="--source jsonl: skip lines that are not a conversation (counted), as "
        "batching.on_bad_sample=skip does in training",
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
        help="batching modes to plan, among " + ",".join(m.value for m in BatchingMode)
        + " (default standard,sorted,bucketed,oracle,odb)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=8, help="standard/sorted")
    parser.add_argument(
        "--window", type=int, default=None, help="odb window cap D (samples; default: config's)"
    )
    parser.add_argument(
        "--window-budgets",
        type=int,
        default=None,
        help="odb window in token budgets of work (default: the config's; 0: D samples)",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="also simulate odb over N ranks: sync efficiency, utilization, steps/oracle",
    )
    parser.add_argument(
        "--dealing",
        choices=["fixed", "by_need"],
        default=None,
        help="shards for --ranks (default: the config's)",
    )
    parser.add_argument("--buckets", type=int, default=6, help="k for the bucket optimizer")
    parser.add_argument("--boundaries", type=_int_list, help="fixed bucket edges (no optimizer)")
    parser.add_argument("--max-batch-size", type=int, default=64, help="bucketed batch cap")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return parser


def read_lengths_file(path: Path) -> list[int]:
    """Lengths from a ``.npy`` array (integer dtype) or whitespace-separated integers."""
    if not path.is_file():
        raise PlanCliError(f"--lengths: no such file {path}")
    if path.suffix == ".npy":
        import numpy as np

        array = np.load(path, allow_pickle=False)
        if not np.issubdtype(array.dtype, np.integer):
            raise PlanCliError(f"--lengths: {path} has dtype {array.dtype}, expected integers")
        return [int(v) for v in array.reshape(-1)]
    lengths = []
    for position, token in enumerate(path.read_text().split()):
        try:
            lengths.append(int(token))
        except ValueError:
            raise PlanCliError(
                f"--lengths: {path} entry {position} is not an integer: {token!r}"
            ) from None
    return lengths


def load_lengths(args: argparse.Namespace) -> tuple[list[int], str]:
    """The lengths the command plans over, and a description of where they came from.

    ``--max-seq-len`` truncates file lengths and synthetic draws, and is handed to
    ``--source`` (default 4096 there).
    """
    if args.lengths is not None:
        lengths, origin = read_lengths_file(args.lengths), str(args.lengths)
    elif args.synthetic is not None:
        mean, cv, n = args.synthetic
        lengths = lognormal_lengths(n, mean, cv, args.seed, max_len=args.max_seq_len)
        origin = f"lognormal(mean={mean:g}, cv={cv:g}, n={n}, seed={args.seed})"
    else:
        try:
            from odb_lightning.data.lengths import measure_source
        except ImportError as error:
            raise PlanCliError(
                f"--source needs the data layer (odb_lightning.data.lengths): {error}"
            ) from error
        max_seq_len = args.max_seq_len or 4096
        if args.source in SOURCES_WITH_PATH and args.path is None:
            raise PlanCliError(f"--source {args.source} needs --path (the data to tokenize)")
        try:
            report = measure_source(
                args.source,
                max_seq_len=max_seq_len,
                max_samples=args.max_samples,
                path=args.path,
                tokenizer=args.tokenizer,
                template=args.template,
                over_length="truncate",  # as training does
                on_bad_record="skip" if args.skip_bad_records else "raise",
            )
        except (OSError, ValueError) as error:  # a missing file, a bad record or template
            raise PlanCliError(f"--source {args.source}: {error}") from None
        lengths = list(report.lengths)
        origin = f"source {args.source} (max_seq_len={max_seq_len})"
        if report.counts.get("dropped/bad_record"):
            origin += f", {report.counts['dropped/bad_record']} bad records skipped"
    if not lengths:
        raise PlanCliError(f"no lengths in {origin}")
    try:
        validate_lengths(lengths)
    except ValueError as error:
        raise PlanCliError(f"{origin}: {error}") from None
    if args.max_seq_len is not None:
        lengths = [min(n, args.max_seq_len) for n in lengths]
    return lengths, origin


def _describe(lengths: list[int], origin: str) -> dict[str, Any]:
    mean = statistics.fmean(lengths)
    return {
        "origin": origin,
        "n": len(lengths),
        "mean": mean,
        "cv": statistics.pstdev(lengths) / mean,
        "min": min(lengths),
        "max": max(lengths),
    }


def _bucket_report(lengths: list[int], budget: int, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    boundaries = args.boundaries or optimize_boundaries(
        lengths, args.buckets, token_budget=budget, max_batch_size=args.max_batch_size
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


def evaluate_budget(lengths: list[int], budget: int, args: argparse.Namespace) -> dict[str, Any]:
    """Plan epoch 0 in every requested mode under one budget; stats as plain dicts."""
    report: dict[str, Any] = {"token_budget": budget, "modes": {}}
    if BatchingMode.BUCKETED in args.modes:
        report["buckets"] = _bucket_report(lengths, budget, args)
    for mode in args.modes:
        config = BatchingConfig(
            mode=mode,
            token_budget=budget,
            batch_size=args.batch_size,
            max_batch_size=args.max_batch_size if mode is BatchingMode.BUCKETED else None,
            boundaries=tuple(report.get("buckets", {}).get("boundaries", ())),
            seed=args.seed,
            **_window_knobs(args),
        )
        batches = plan_epoch(lengths, config)
        stats = summarize_plan(lengths, batches, budget, packed=mode is BatchingMode.ODB_PACKED)
        report["modes"][mode.value] = dataclasses.asdict(stats)
    if args.ranks:
        report["ranks"] = evaluate_ranks(lengths, budget, args)
    report["comparison"] = {
        name: report["modes"][name]["padding_efficiency"]
        for name in ("sorted", "standard", "bucketed")
        if name in report["modes"]
    }
    return report


def _window_knobs(args: argparse.Namespace) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    if args.window is not None:
        knobs["outstanding_depth"] = args.window
    if args.window_budgets is not None:
        knobs["window_budgets"] = args.window_budgets or None
    if getattr(args, "dealing", None) is not None:
        knobs["shard_dealing"] = args.dealing
    return knobs


def evaluate_ranks(lengths: list[int], budget: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``odb`` epoch simulated over ``--ranks`` ranks, dealt as the loader deals the
    epoch's seeded order, scored by its slowest rank (:mod:`odb_lightning.core.sync`)."""
    if args.ranks < 1:
        raise PlanCliError(f"--ranks must be >= 1, got {args.ranks}")
    config = BatchingConfig(token_budget=budget, seed=args.seed, **_window_knobs(args))
    ordered = [lengths[i] for i in epoch_permutation(len(lengths), args.seed, 0)]
    world = args.ranks
    if config.shard_dealing is ShardDealing.BY_NEED:
        result = simulate_dealt_epoch(ordered, world, config)
    else:
        result = simulate_epoch([ordered[r::world] for r in range(world)], config)
    oracle = len(plan_epoch(lengths, mode="oracle", token_budget=budget)) / world
    steps = len(result.steps[0])
    return {
        "world_size": world,
        "shard_dealing": config.shard_dealing.value,
        "window_budgets": config.window_budgets,
        "outstanding_depth": config.outstanding_depth,
        "rounds": result.rounds,
        "steps_per_rank": steps,
        "steps_vs_oracle": steps / oracle,
        "sync_efficiency": result.sync.sync_efficiency,
        "utilization": result.sync.utilization,
        "idle_fraction": result.sync.idle_fraction,
    }


MODE_COLUMNS = ("mode", "steps", "batch", "pad. eff.", "budget fill", "over budget")
BUCKET_COLUMNS = ("range", "count", "mean len", "batch", "predicted eff.", "measured eff.")


def _mode_table(report: dict[str, Any]) -> Table:
    table = Table(title=f"token_budget = {report['token_budget']} (one epoch)")
    for column in MODE_COLUMNS:
        table.add_column(column, justify="left" if column == "mode" else "right")
    for mode, s in report["modes"].items():
        table.add_row(
            mode,
            str(s["steps"]),
            f"{s['mean_batch_size']:.1f}",
            f"{s['padding_efficiency']:.1%}",
            f"{s['budget_fill']:.1%}",
            str(s["over_budget_batches"]),
        )
    return table


def _bucket_table(buckets: dict[str, Any]) -> Table:
    how = f"optimized in {buckets['optimizer_s']:.2f} s" if buckets["optimized"] else "given"
    table = Table(title=escape(f"buckets {buckets['boundaries']} ({how})"))
    for column in BUCKET_COLUMNS:
        table.add_column(column, justify="right")
    for row in buckets["table"]:
        table.add_row(
            escape(f"[{row['lo']}, {row['hi']})"),
            str(row["count"]),
            f"{row['mean_length']:.0f}",
            str(row["batch_size"]),
            f"{row['predicted_efficiency']:.1%}",
            f"{row['efficiency']:.1%}",
        )
    return table


def _render(result: dict[str, Any], console: Console) -> None:
    info = result["lengths"]
    console.print(
        f"[bold]{escape(info['origin'])}[/]: n={info['n']}, mean={info['mean']:.0f}, "
        f"cv={info['cv']:.2f}, min={info['min']}, max={info['max']}"
    )
    for report in result["budgets"]:
        console.print(_mode_table(report))
        if "buckets" in report:
            console.print(_bucket_table(report["buckets"]))
            predicted = report["buckets"]["predicted_efficiency"]
            console.print(f"bucketed: predicted padding efficiency {predicted:.1%}")
        if "ranks" in report:
            r = report["ranks"]
            console.print(
                f"odb over {r['world_size']} ranks ({r['shard_dealing']} shards): "
                f"{r['steps_per_rank']} steps/rank ({r['steps_vs_oracle']:.3f} x oracle), "
                f"sync efficiency {r['sync_efficiency']:.1%}, utilization "
                f"{r['utilization']:.1%}, IDLE {r['idle_fraction']:.1%}"
            )
        names = {"standard": "random (standard)"}
        console.print(
            "comparison: "
            + " / ".join(f"{names.get(k, k)} {v:.1%}" for k, v in report["comparison"].items())
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``odb-plan``; returns the exit status."""
    args = build_parser().parse_args(argv)
    budgets = [b for group in (args.budget or [[DEFAULT_BUDGET]]) for b in group]
    try:
        lengths, origin = load_lengths(args)
        result = {
            "lengths": _describe(lengths, origin),
            "settings": {
                "batch_size": args.batch_size,
                "window": args.window,
                "window_budgets": args.window_budgets,
                "ranks": args.ranks,
                "buckets": args.buckets,
                "max_batch_size": args.max_batch_size,
                "seed": args.seed,
                "modes": [m.value for m in args.modes],
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
        _render(result, Console())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
