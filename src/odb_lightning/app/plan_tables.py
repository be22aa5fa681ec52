"""The tables ``odb-plan`` prints: one per token budget, the bucket table, the rank line."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

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


def render(result: dict[str, Any], console: Console) -> None:
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
                + (
                    f", grouped across ranks: {r['moved_samples']} samples moved "
                    f"({r['moved_samples_per_rank_step']:.2f} samples, "
                    f"{r['moved_tokens_per_rank_step']:,.0f} tokens, about "
                    f"{r['moved_wire_bytes_per_rank_step'] / 1024:,.1f} KiB on the wire "
                    "per rank step)"
                    if r["cross_rank_grouping"]
                    else ""
                )
            )
        names = {"standard": "random (standard)"}
        console.print(
            "comparison: "
            + " / ".join(f"{names.get(k, k)} {v:.1%}" for k, v in report["comparison"].items())
        )
        if report.get("advice"):
            console.print(f"[yellow]note[/]: {escape(report['advice'])}")
