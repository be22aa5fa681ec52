"""The run summary (``summary.json``, whose keys ``docs/summary.md`` defines): one builder
that collects from the providers the app hands it, on every rank at the end of training.

The providers are typed (:mod:`odb_lightning.lit.callbacks.run_report`): the step counters, the data
module's :class:`~odb_lightning.lit.callbacks.run_report.RunReport`, the module's parameter counts
and compile report, and callbacks with entries of their own. Their gathers are
collectives, so every rank builds the summary; rank 0's copy is the one the app writes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from odb_lightning.lit.callbacks.counters import RankTotals, StepCounters
from odb_lightning.lit.callbacks.rank_gather import gather_rows
from odb_lightning.lit.callbacks.run_report import (
    AddsToSummary,
    CountsParameters,
    LoaderCounters,
    ParameterCounts,
    ReportsCompile,
    ReportsRun,
    RunReport,
)
from odb_lightning.lit.callbacks.summary_table import is_fixed_size
from odb_lightning.runtime.resume import gather_objects


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, 0 for a zero denominator."""
    return numerator / denominator if denominator else 0.0


class SummaryBuilder(pl.Callback):
    """Builds the run summary at the end of training, on every rank, into :attr:`summary`,
    and gives its numbers to the trainer's loggers (rank 0).

    Args:
        counters: The step counters of this rank.
        run_report: The data module's report of the run (``None``: no data facts).
        parameters: The module's parameter counts (the summary's ``model`` block).
        compiled: The module's compile report (graphs, recompiles, seconds).
        extras: Callbacks with entries of their own (step metrics, memory warm-up).
    """

    def __init__(
        self,
        counters: StepCounters,
        run_report: ReportsRun | None = None,
        parameters: CountsParameters | None = None,
        compiled: ReportsCompile | None = None,
        extras: Sequence[AddsToSummary] = (),
    ) -> None:
        self.counters, self.run_report = counters, run_report
        self.parameters, self.compiled, self.extras = parameters, compiled, tuple(extras)
        self.summary: dict[str, Any] = {}

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.summary = self.build(trainer, pl_module)
        if trainer.is_global_zero:
            publish_to_loggers(trainer, self.summary)

    def build(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The summary (every rank must call it: its gathers are collectives)."""
        per_rank = self.counters.totals.gather(trainer, pl_module)
        report = self.run_report.run_report() if self.run_report is not None else None
        summary = step_figures(trainer, per_rank, report, self.counters.train_s)
        if self.parameters is not None:
            counts = self.parameters.parameter_counts()
            summary["model"] = asdict(ParameterCounts.of(counts))
        if self.compiled is not None and (entries := self.compiled.compile_report()):
            summary.update(entries)  # model.runtime.compile: graphs, recompiles, seconds
        if report is not None:
            summary.update(loader_figures(trainer, pl_module, report, summary["steps_per_rank"]))
        summary["not_trained_samples"] = not_trained_samples(trainer, summary)
        if is_fixed_size(summary):
            # batch_size samples a step whatever their length: no budget to go over.
            summary["over_budget_samples"] = None
        for extra in self.extras:  # on every rank: the entries may gather
            summary.update(extra.summary_entries(trainer, pl_module))
        return summary


def step_figures(
    trainer: pl.Trainer, per_rank: list[RankTotals], report: RunReport | None, wall_s: float
) -> dict[str, Any]:
    """The run's facts and the figures of every rank's step counters."""
    total = {f.name: sum(getattr(r, f.name) for r in per_rank) for f in fields(RankTotals)}
    padded_per_rank = [r.padded_tokens for r in per_rank]
    mean_padded = statistics.fmean(padded_per_rank) if padded_per_rank else 0.0
    facts = report.summary_facts() if report is not None else {}
    token_budget = report.batching.token_budget if report is not None else None
    steps = per_rank[0].steps if per_rank else 0
    summary: dict[str, Any] = {
        **facts,
        "token_budget": token_budget,
        "world_size": trainer.world_size,
        "optimizer_steps": trainer.global_step,
        "steps_per_rank": steps,
        "emitted_samples": total["samples"],
        "idle_steps": total["idle_steps"],
        "real_tokens": total["real_tokens"],
        "padded_tokens": total["padded_tokens"],
        "loss_tokens": total["loss_tokens"],
        "padding_efficiency": ratio(total["real_tokens"], total["padded_tokens"]),
        "budget_fill": ratio(mean_padded, (token_budget or 0) * steps),
        "rank_imbalance": ratio(max(padded_per_rank, default=0), mean_padded),
        "wall_s": wall_s,
        "emitted_samples_per_s": ratio(total["samples"], wall_s),
        "real_tokens_per_s": ratio(total["real_tokens"], wall_s),
        "padded_tokens_per_s": ratio(total["padded_tokens"], wall_s),
        "loader_wait_share": ratio(
            max(r.loader_wait_s for r in per_rank) if per_rank else 0.0, wall_s
        ),
        "train_loss": _metric(trainer, "train/loss"),
        "val_loss": _metric(trainer, "val/loss"),
    }
    summary.update(summary_sync_figures(per_rank))
    summary["per_rank"] = [asdict(r) for r in per_rank]
    return summary


def summary_sync_figures(per_rank: list[RankTotals]) -> dict[str, float]:
    """Sync efficiency and utilization of the run (:mod:`odb_lightning.core.sync`), from
    the step costs the alignment plans gave every rank (none in planned modes)."""
    first = per_rank[0] if per_rank else None
    if first is None or not first.costed_steps:
        return {}
    world = len(per_rank)
    return {
        "sync_efficiency": first.cost_over_max / (world * first.costed_steps),
        "utilization": sum(r.useful_cost for r in per_rank) / (world * first.max_cost),
    }


def loader_figures(
    trainer: pl.Trainer, pl_module: pl.LightningModule, report: RunReport, steps_per_rank: int
) -> dict[str, Any]:
    """The loaders' counters, patch fill, skipped ids and first-epoch record counts, over
    every rank (three gathers; every rank calls it)."""
    figures: dict[str, Any] = _gather_loader_counters(trainer, pl_module, report.counters)
    max_patches = report.batching.rows.max_patches
    rank_steps = trainer.world_size * steps_per_rank
    # Mean ViT patches per rank step over max_patches (image-text data).
    figures["patch_fill"] = (
        ratio(figures["image_patches"], max_patches * rank_steps) if max_patches else None
    )
    # What grouping across ranks sent over the channel, per rank step (bytes compressed).
    figures["moved_samples_per_rank_step"] = ratio(figures["moved_samples"], rank_steps)
    figures["moved_bytes_per_rank_step"] = ratio(figures["moved_bytes"], rank_steps)
    rows = gather_objects(list(report.skipped_sample_ids), trainer.world_size)
    figures["skipped_sample_ids"] = sorted(i for row in rows for i in row)
    figures.update(_gather_first_epoch_records(trainer, pl_module, report))
    return figures


def _metric(trainer: pl.Trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def _gather_loader_counters(
    trainer: pl.Trainer, pl_module: pl.LightningModule, local: LoaderCounters
) -> dict[str, int]:
    """Every rank's loader counters (dropped, over budget, skipped bad samples) summed;
    alignment rounds are the same on every rank."""
    names = [f.name for f in fields(LoaderCounters)]
    rows = gather_rows(trainer, pl_module, [float(getattr(local, n)) for n in names])
    totals = {n: int(sum(row[i] for row in rows)) for i, n in enumerate(names)}
    totals["alignment_rounds"] = int(max(row[names.index("alignment_rounds")] for row in rows))
    return totals


def _gather_first_epoch_records(
    trainer: pl.Trainer, pl_module: pl.LightningModule, report: RunReport
) -> dict[str, int]:
    """The loader's counts of unsupervised and truncated training records, summed over
    ranks, where every rank's loader counted them (one all-gather; every rank calls it)."""
    names = ("unsupervised_samples", "truncated_samples")
    local = [float(report.first_epoch_records.get(n, -1)) for n in names]
    rows = gather_rows(trainer, pl_module, local)
    return {
        n: int(sum(row[i] for row in rows))
        for i, n in enumerate(names)
        if all(row[i] >= 0 for row in rows)
    }


def not_trained_samples(trainer: pl.Trainer, summary: dict[str, Any]) -> int | None:
    """Training samples of the epochs run that no step emitted and that are not counted
    as dropped or skipped: cut by ``limit_train_batches`` (or by ``max_steps``)."""
    train_samples = summary.get("train_samples")
    if train_samples is None:
        return None
    epochs = trainer.fit_loop.epoch_progress.current.started
    accounted = summary.get("emitted_samples", 0) + summary.get("dropped_samples", 0)
    accounted += summary.get("skipped_bad_samples", 0)
    return max(0, train_samples * epochs - accounted)


def numeric_summary(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers, the ``model`` block's as ``model/<name>``."""
    model = {f"model/{k}": v for k, v in summary.get("model", {}).items()}
    return {
        k: float(v)
        for k, v in {**summary, **model}.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def publish_to_loggers(trainer: pl.Trainer, summary: dict[str, Any]) -> None:
    """Each figure once: into the run summary where the logger keeps one (W&B), under its
    ``summary.json`` name; as ``summary/<name>`` metrics elsewhere (CSV)."""
    numbers = numeric_summary(summary)
    for logger in trainer.loggers:
        experiment_summary = getattr(getattr(logger, "experiment", None), "summary", None)
        if experiment_summary is not None and hasattr(experiment_summary, "update"):
            experiment_summary.update(numbers)
        else:
            logger.log_metrics({f"summary/{k}": v for k, v in numbers.items()})
