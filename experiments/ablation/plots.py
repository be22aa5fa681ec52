"""Plots of the ablation (``run.py`` writes the figures next to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("emitted_samples_per_s", "emitted samples/s"),
    ("padding_efficiency", "padding efficiency"),
    ("steps_per_rank", "steps per epoch"),
    ("loader_wait_share", "loader wait share"),
    ("peak_pss_mib", "peak memory, PSS (MiB)"),
)


def plot_train(train: dict[str, Any], here: Path) -> None:
    """One row of panels per sweep: median (line) and every repeat (dots)."""
    figure, axes = plt.subplots(
        len(train), len(PANELS), figsize=(4 * len(PANELS), 3.4 * len(train))
    )
    for row, sweep in zip(axes, train.values(), strict=True):
        key = sweep["key"]
        xs = [p[key] for p in sweep["points"]]
        for axis, (metric, title) in zip(row, PANELS, strict=True):
            axis.plot(xs, [p["median"][metric] for p in sweep["points"]], marker="o")
            for p in sweep["points"]:
                axis.scatter(
                    [p[key]] * len(p["runs"]), [r[metric] for r in p["runs"]], s=8, c="grey"
                )
            axis.set_xscale("log", base=2)
            axis.set_xticks(xs, [str(x) for x in xs], fontsize=7)
            axis.set_xlabel(key.split(".")[-1])
            axis.set_title(title, fontsize=10)
    figure.suptitle("CPU training (model=cpu_bench), ShareGPT first exchanges; median of repeats")
    figure.tight_layout()
    figure.savefig(here / "ablation_train.png", dpi=110)
    plt.close(figure)


def plot_simulator(simulator: dict[str, Any], here: Path) -> None:
    """Steps per rank / oracle against D (8 and 64 ranks), and against the shard size."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    worlds = sorted({r["world_size"] for r in simulator["rows"]})
    for world in worlds:
        rows = [r for r in simulator["rows"] if r["world_size"] == world]
        depths = [r["outstanding_depth"] for r in rows]
        label = f"{world} ranks"
        axes[0].plot(depths, [r["steps_vs_oracle"] for r in rows], marker="o", label=label)
        axes[1].plot(depths, [r["padding_efficiency"] for r in rows], marker="o", label=label)
        shards = [r for r in simulator["depth_512_by_shard_size"] if r["world_size"] == world]
        axes[2].plot(
            [r["samples_per_rank"] for r in shards],
            [r["steps_vs_oracle"] for r in shards],
            marker="o",
            label=label,
        )
    axes[0].axhline(1.08, color="grey", linestyle="--", linewidth=1, label="oracle + 8 %")
    axes[2].axhline(1.08, color="grey", linestyle="--", linewidth=1, label="oracle + 8 %")
    titles = (
        f"steps per rank / oracle ({simulator['samples_per_rank']:,} per rank)",
        "padding efficiency",
        "steps / oracle at D = 512 vs shard size",
    )
    for axis, title, xlabel in zip(
        axes, titles, ("outstanding_depth", "outstanding_depth", "samples per rank"), strict=True
    ):
        axis.set_xscale("log", base=2)
        axis.set_xlabel(xlabel)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    figure.suptitle(
        f"Simulator, ShareGPT whole conversations, budget {simulator['token_budget']:,}"
    )
    figure.tight_layout()
    figure.savefig(here / "ablation_simulator.png", dpi=110)
    plt.close(figure)


def markdown_tables(report: dict[str, Any]) -> str:
    """The README tables, from ``results.json``."""
    lines = []
    for sweep in report.get("train", {}).values():
        key = sweep["key"].split(".")[-1]
        lines += [
            f"| {key} | samples/s | vs base (cost model) | CPU s / run | padding eff. | "
            "budget fill | steps | loader wait share | peak PSS MiB (RSS sum) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in sweep["points"]:
            m = p["median"]
            lines.append(
                f"| {p[sweep['key']]:,} | {m['emitted_samples_per_s']:.2f} | "
                f"{p['throughput_vs_base']:.2f}x ({p['predicted_vs_base']:.2f}x) | "
                f"{m['cpu_s']:.0f} | {m['padding_efficiency']:.3f} | {m['budget_fill']:.3f} | "
                f"{m['steps_per_rank']:.0f} | {m['loader_wait_share']:.3f} | "
                f"{m['peak_pss_mib']:,.0f} ({m['peak_rss_mib']:,.0f}) |"
            )
        lines.append("")
    simulator = report.get("simulator")
    if simulator:
        lines += [
            "| D | ranks | steps/rank | oracle | steps / oracle | saved by doubling D | "
            "padding eff. | rounds |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in simulator["rows"]:
            world, depth = row["world_size"], row["outstanding_depth"]
            saved = simulator["flatten"][str(world)]["steps_saved_by_doubling_to"].get(str(depth))
            lines.append(
                f"| {depth:,} | {world} | {row['steps_per_rank']} | "
                f"{row['oracle_steps_per_rank']:.1f} | {row['steps_vs_oracle']:.3f} | "
                f"{'' if saved is None else f'{100 * saved:.1f} %'} | "
                f"{row['padding_efficiency']:.3f} | {row['rounds']} |"
            )
        lines += ["", "| samples per rank | ranks | steps / oracle at D = 512 |", "|---|---|---|"]
        for row in simulator["depth_512_by_shard_size"]:
            lines.append(
                f"| {row['samples_per_rank']:,}{' (resampled)' if row['resampled'] else ''} | "
                f"{row['world_size']} | {row['steps_vs_oracle']:.3f} |"
            )
    return "\n".join(lines)
