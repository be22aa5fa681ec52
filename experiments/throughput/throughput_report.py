"""Medians, per-repeat ratios, the FLOP-model predictions and the plot of the study."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from odb_lightning.lit.model.flops import flops_per_token

BASELINE, REFERENCE = "standard_bs8", "reference"


@dataclass(frozen=True)
class FlopModel:
    """Training FLOPs of the stand-in, from ``odb_lightning.lit.model.flops.flops_per_token``.

    Attributes:
        body_linear: Body FLOPs per token without attention scores (the ``6 N`` part).
        attention_per_key: Body FLOPs per token per attended key (forward + backward).
        head: LM-head FLOPs per supervised token.
    """

    body_linear: float
    attention_per_key: float
    head: float

    def body(self, context_tokens: float) -> float:
        return self.body_linear + self.attention_per_key * context_tokens

    def describe(self) -> dict[str, float]:
        return {
            "body_without_attention": self.body_linear,
            "attention_per_attended_key": self.attention_per_key,
            "head_per_supervised_token": self.head,
        }


def flop_model(config: PretrainedConfig) -> FlopModel:
    plain = flops_per_token(config, context_tokens=0.0)
    one_key = flops_per_token(config, context_tokens=1.0)
    return FlopModel(plain["body"], one_key["body"] - plain["body"], plain["head"])


def token_cost(record: Any, flops: FlopModel, mean_context: float) -> float:
    """SPEC 6's cost model per emitted sample: ``body x padded + head x supervised``
    tokens, the body at the samples' mean causal context."""
    cost = flops.body(mean_context) * record.padded_tokens + flops.head * record.loss_tokens
    return cost / record.samples


def row_cost(record: Any, flops: FlopModel) -> float:
    """What a masked attention kernel executes, per emitted sample: each row of length
    ``n`` attends over the full ``n x n`` square (padding and, for a packed row's dense
    block mask, every other sample of the row included)."""
    body = sum(rows * n * flops.body(n) for rows, n, _ in record.shapes)
    return (body + flops.head * record.loss_tokens) / record.samples


def _rate(record: Any) -> float:
    return record.samples / record.wall_s


def _pair_ratio(runs: list[Any], others: list[Any] | None) -> float | None:
    if not others:
        return None
    return statistics.median(_rate(a) / _rate(b) for a, b in zip(runs, others, strict=True))


def summarize(
    runs: dict[str, list[Any]], data: Any, flops: FlopModel, token_budget: int
) -> dict[str, Any]:
    """The results table of one regime: medians, ratios, predictions."""
    mean_context = statistics.fmean((n + 1) / 2 for n in data.lengths)
    base = runs.get(BASELINE)
    reference = runs.get(REFERENCE)
    table: dict[str, Any] = {}
    for arm, records in runs.items():
        first = records[0]
        row: dict[str, Any] = {
            "samples_per_s": statistics.median(_rate(r) for r in records),
            "real_tokens_per_s": statistics.median(r.real_tokens / r.wall_s for r in records),
            "padding_efficiency": first.real_tokens / first.padded_tokens,
            "steps": first.steps,
            "samples": first.samples,
            "vs_standard": _pair_ratio(records, base),
            "vs_reference": _pair_ratio(records, reference),
            "budget_fill": first.padded_tokens / first.steps / token_budget,
            "real_tokens": first.real_tokens,
            "padded_tokens": first.padded_tokens,
            "loss_tokens": first.loss_tokens,
            "all_samples_per_s": [_rate(r) for r in records],
            "wall_s": [r.wall_s for r in records],
            "loader_wait_s": [r.loader_wait_s for r in records],
            "load_average": [r.load_average for r in records],
            "cpu_share": [r.cpu_s / r.wall_s for r in records],
            # Load-robust cross-check: samples per CPU second of the training loop.
            "samples_per_cpu_s": statistics.median(r.samples / r.cpu_s for r in records),
        }
        for name, others in (("standard", base), ("reference", reference)):
            if not others:
                continue
            tokens = token_cost(others[0], flops, mean_context) / token_cost(
                first, flops, mean_context
            )
            rows = row_cost(others[0], flops) / row_cost(first, flops)
            measured = row[f"vs_{name}"]
            row[f"predicted_vs_{name}"] = tokens
            row[f"predicted_vs_{name}_rows"] = rows
            row[f"realized_fraction_vs_{name}"] = measured / tokens
            row[f"realized_fraction_vs_{name}_rows"] = measured / rows
        table[arm] = row
    return {
        "arms": table,
        "samples": len(data.lengths),
        "real_tokens": sum(data.lengths),
        "mean_causal_context": mean_context,
        "regime_mean": data.population.mean,
        "regime_cv": data.population.cv,
        "regime_p99": data.population.p99,
    }


def summarize_grouping(
    records: dict[str, Any], data: Any, flops: FlopModel, token_budget: int
) -> dict[str, Any]:
    """Steps and padding of whole-regime epochs (no model), and the gains the FLOP
    models predict from them."""
    mean_context = statistics.fmean((n + 1) / 2 for n in data.lengths)
    table: dict[str, Any] = {}
    for arm, record in records.items():
        row: dict[str, Any] = {
            "samples": record.samples,
            "steps": record.steps,
            "padding_efficiency": record.real_tokens / record.padded_tokens,
            "budget_fill": record.padded_tokens / record.steps / token_budget,
            "loader_samples_per_s": record.samples / record.wall_s if record.wall_s else None,
        }
        for name in (BASELINE, REFERENCE):
            other = records[name]
            row[f"predicted_vs_{name}"] = token_cost(other, flops, mean_context) / token_cost(
                record, flops, mean_context
            )
            row[f"predicted_vs_{name}_rows"] = row_cost(other, flops) / row_cost(record, flops)
        table[arm] = row
    return {"arms": table, "samples": len(data.lengths), "regime_mean": data.population.mean,
            "regime_cv": data.population.cv}  # fmt: skip


def plot_results(report: dict[str, Any], path: Path) -> None:
    """Samples/s per arm and regime; measured vs predicted gain over ``standard_bs8``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(report["regimes"])
    arms = list(next(iter(report["regimes"].values()))["arms"])
    figure, (bars, gains) = plt.subplots(1, 2, figsize=(15, 5.5))
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        rates = [report["regimes"][r]["arms"][arm]["samples_per_s"] for r in regimes]
        spread = [report["regimes"][r]["arms"][arm]["all_samples_per_s"] for r in regimes]
        low = [m - min(s) for m, s in zip(rates, spread, strict=True)]
        high = [max(s) - m for m, s in zip(rates, spread, strict=True)]
        positions = [i + (k - len(arms) / 2 + 0.5) * width for i in range(len(regimes))]
        bars.bar(positions, rates, width, yerr=[low, high], capsize=2, label=arm)
    bars.set_xticks(range(len(regimes)), regimes)
    bars.set_ylabel("emitted samples/s (median, min-max)")
    bars.set_title("CPU training throughput, model=cpu_bench")
    bars.legend(fontsize=8, ncol=2)
    for marker, key in (("o", "predicted_vs_standard"), ("s", "predicted_vs_standard_rows")):
        points = [
            (row[key], row["vs_standard"], f"{arm} ({r})")
            for r in regimes
            for arm, row in report["regimes"][r]["arms"].items()
            if arm != BASELINE and row.get(key) is not None
        ]
        label = "tokens model" if key == "predicted_vs_standard" else "rows model (masked square)"
        gains.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, label=label)
        if key == "predicted_vs_standard_rows":
            for x, y, name in points:
                gains.annotate(name, (x, y), fontsize=5, alpha=0.7)
    top = max([*gains.get_xlim(), *gains.get_ylim()])
    gains.plot([0, top], [0, top], color="grey", linewidth=0.8, label="measured = predicted")
    gains.set_xlabel("predicted gain over standard_bs8 (FLOP model)")
    gains.set_ylabel("measured gain (median of per-repeat ratios)")
    gains.set_title("measured vs predicted, every arm and regime")
    gains.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def markdown_tables(report: dict[str, Any]) -> str:
    """The README's tables, from ``results.json``."""
    lines = [
        "| regime | arm | samples/s | real tok/s | padding eff. | steps | vs standard (pred.) "
        "| vs reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for regime, table in report["regimes"].items():
        for k, (arm, row) in enumerate(table["arms"].items()):
            label = f"{regime} (CV {table['regime_cv']:.2f})" if k == 0 else ""
            steps = f"{row['steps']:,}" + ("*" if row["samples"] != table["samples"] else "")
            lines.append(
                f"| {label} | {arm} | {row['samples_per_s']:.2f} | {row['real_tokens_per_s']:,.0f}"
                f" | {row['padding_efficiency']:.3f} | {steps} | {row['vs_standard']:.2f}x "
                f"({row['predicted_vs_standard']:.2f}x / {row['predicted_vs_standard_rows']:.2f}x)"
                f" | {row['vs_reference']:.2f}x |"
            )
    grouping = report.get("whole_regime_grouping") or {}
    if grouping:
        lines += [
            "",
            "| regime | arm | samples | steps | padding eff. | budget fill | loader samples/s "
            "| predicted vs standard / vs reference |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for regime, table in grouping.items():
            for k, (arm, row) in enumerate(table["arms"].items()):
                rate = row["loader_samples_per_s"]
                lines.append(
                    f"| {regime if k == 0 else ''} | {arm} | {row['samples']:,} | "
                    f"{row['steps']:,} | {row['padding_efficiency']:.3f} | "
                    f"{row['budget_fill']:.3f} | {'-' if rate is None else f'{rate:,.0f}'} | "
                    f"{row['predicted_vs_standard_bs8_rows']:.2f}x / "
                    f"{row['predicted_vs_reference_rows']:.3f}x |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    import json

    here = Path(__file__).resolve().parent
    print(markdown_tables(json.loads((here / "results.json").read_text())))
