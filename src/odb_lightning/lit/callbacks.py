"""Run metrics: literal emitted samples and tokens per wall second, padding efficiency,
budget fill, IDLE steps and loader wait; an end-of-run table and ``summary.json`` (with
the model's trainable and total parameters).

Counts come from each batch's step metadata and are summed over ranks at the end, so the
throughput figures are emitted samples over wall time, never ``batch_size x steps``.
(Lightning's ``ThroughputMonitor`` multiplies one device's rate by the world size, which
is wrong when ranks emit different batch sizes, as they do here.)
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from rich.console import Console
from rich.table import Table
from typing_extensions import override

from odb_lightning.core.modes import MODES
from odb_lightning.lit.run_report import (
    AddsToSummary,
    CountsParameters,
    LoaderCounters,
    NoSupervisedTokensError,
    ParameterCounts,
    ReportsRun,
    RunReport,
)
from odb_lightning.runtime.resume import gather_objects


@dataclass
class RankTotals:
    """Counters of one rank, summed over the run."""

    steps: int = 0
    idle_steps: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    loss_tokens: int = 0
    loader_wait_s: float = 0.0
    max_cost: int = 0  # sum over steps of the slowest rank's cost (equal on every rank)
    cost_over_max: float = 0.0  # sum over steps of (cost over all ranks) / (slowest one's)
    costed_steps: int = 0
    useful_cost: int = 0

    def add(self, meta: Any, wait_s: float) -> None:
        self.steps += 1
        self.loader_wait_s += wait_s
        if getattr(meta, "step_max_cost", None):
            self.max_cost += meta.step_max_cost
            self.cost_over_max += meta.step_cost_sum / meta.step_max_cost
            self.costed_steps += 1
            self.useful_cost += meta.local_useful_cost or 0
        if meta.is_idle:
            self.idle_steps += 1
            return
        self.samples += meta.local_samples
        self.real_tokens += meta.local_real_tokens
        self.padded_tokens += meta.local_padded_tokens
        self.loss_tokens += meta.local_loss_tokens


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


class ODBMetricsCallback(pl.Callback):
    """Collects step metadata, logs throughput, writes the summary and the id audit.

    Its counters are part of a checkpoint (per rank, with the training wall time), so the
    step, sample and token figures of a resumed run's summary cover the whole run (the
    data module's loader counters cover the resumed run); the id audit is appended to.

    Args:
        output_dir: Directory of the run (``summary.json`` and audit files go here).
        audit_ids: Write ``emitted_ids_rank{r}.jsonl``: one line per step,
            ``{"ids": [...], "indices": [...]}``: the records' own ids (as the source has
            them) and their dataset indices, both ``[]`` for IDLE.
        log_every_n_steps: How often throughput is logged (a cross-rank reduction).
    """

    def __init__(
        self,
        output_dir: str,
        audit_ids: bool = False,
        log_every_n_steps: int = 10,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.audit_ids = audit_ids
        self.log_every_n_steps = log_every_n_steps
        self.totals = RankTotals()
        self.summary: dict[str, Any] = {}
        self._train_s = 0.0
        self._epoch_start: float | None = None
        self._last_batch_end: float | None = None
        self._wait_s = 0.0
        self._audit_file: Any = None
        self._trainer: pl.Trainer | None = None
        self._resumed = False
        self._supervision_checked = False
        self._rates_logged = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict() gathers every rank's counters

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # A run resumed mid-epoch gets no on_train_epoch_start for that epoch.
        self._epoch_start = self._last_batch_end = time.perf_counter()
        if self.audit_ids:
            path = self.output_dir / f"emitted_ids_rank{trainer.global_rank}.jsonl"
            self._audit_file = path.open("a" if self._resumed else "w", encoding="utf-8")

    @override
    def state_dict(self) -> dict[str, Any]:
        """Every rank's counters and the training wall time so far (a collective)."""
        trainer = self._trainer
        if trainer is None or trainer.lightning_module is None:
            return {}
        train_s = self._train_s
        if self._epoch_start is not None and self._last_batch_end is not None:
            train_s += self._last_batch_end - self._epoch_start
        per_rank = self._gather_totals(trainer, trainer.lightning_module)
        return {"per_rank": [asdict(r) for r in per_rank], "train_s": train_s}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._resumed = True
        trainer = self._trainer
        per_rank = state_dict["per_rank"]
        if trainer is None or len(per_rank) != trainer.world_size:
            rank_zero_warn(
                f"checkpoint counters are from {len(per_rank)} ranks, this run has "
                f"{trainer.world_size if trainer else '?'}: the summary counts this run only"
            )
            return
        self.totals = RankTotals(**per_rank[trainer.global_rank])
        self._train_s = float(state_dict["train_s"])

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = self._last_batch_end = time.perf_counter()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._wait_s = now - (self._last_batch_end or now)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        meta = batch.meta
        self.totals.add(meta, self._wait_s)
        self._last_batch_end = time.perf_counter()
        if self._audit_file is not None:
            self._audit_file.write(json.dumps(_audit_line(trainer, meta.sample_ids)) + "\n")
            self._audit_file.flush()  # a killed run keeps every completed step's line
        # From this process's first step on (the progress bar shows them), then every N
        # steps; every rank reaches the same step counts, so each one joins the reduction.
        if self.totals.steps % self.log_every_n_steps == 0 or not self._rates_logged:
            self._rates_logged = True
            self._log_rates(trainer, pl_module)

    def _log_rates(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        elapsed = self._train_s + time.perf_counter() - (self._epoch_start or 0.0)
        local = torch.tensor(
            [self.totals.real_tokens, self.totals.padded_tokens, self.totals.samples],
            dtype=torch.float64,
            device=pl_module.device,
        )
        real, padded, samples = trainer.strategy.reduce(local, reduce_op="sum").tolist()
        pl_module.log("perf/real_tokens_per_s", real / elapsed, prog_bar=True, rank_zero_only=True)
        pl_module.log("perf/samples_per_s", samples / elapsed, prog_bar=True, rank_zero_only=True)
        pl_module.log("odb/padding_efficiency", _ratio(real, padded), rank_zero_only=True)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch_start is not None and self._last_batch_end is not None:
            self._train_s += self._last_batch_end - self._epoch_start
        self._epoch_start = None
        if not self._supervision_checked:
            self._supervision_checked = True
            self._check_supervised(trainer, pl_module)

    def _check_supervised(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuse to go on after a whole epoch without a supervised token on any rank.

        The data module refuses such data at startup where it can tell (length-pass
        modes; records without an assistant turn). Online modes tokenize in the loader
        workers, so a set whose assistant turns are all cut off by ``max_seq_len`` is
        only known here, after the first epoch (one all-gather, once per run).
        """
        rows = _gather_rows(trainer, pl_module, [float(self.totals.loss_tokens)])
        samples = _gather_rows(trainer, pl_module, [float(self.totals.samples)])
        if sum(row[0] for row in rows) > 0 or not any(row[0] for row in samples):
            return
        report = _run_report(trainer)
        max_seq_len = report.facts.get("max_seq_len") if report is not None else None
        emitted = int(sum(row[0] for row in samples))
        raise NoSupervisedTokensError(
            f"no supervised tokens in the first training epoch: {emitted} samples emitted "
            f"over {trainer.world_size} rank(s), every label -100 after the template and "
            f"max_seq_len={max_seq_len}; training changes nothing. SFT trains on assistant "
            "turns: check that the data has them within data.max_seq_len tokens"
        )

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._audit_file is not None:
            self._audit_file.close()
            self._audit_file = None
        per_rank = self._gather_totals(trainer, pl_module)
        report = _run_report(trainer)
        self.summary = self._summarize(trainer, per_rank, report)
        if isinstance(pl_module, CountsParameters):
            self.summary["model"] = asdict(ParameterCounts.of(pl_module.parameter_counts()))
        compiled = getattr(pl_module, "compile_report", None)
        if callable(compiled) and (entries := compiled()):  # model.runtime.compile: graphs, seconds
            self.summary.update(entries)
        if report is not None:
            self.summary.update(_gather_loader_counters(trainer, pl_module, report.counters))
            max_patches = report.batching.rows.max_patches
            rank_steps = trainer.world_size * self.summary["steps_per_rank"]
            # Mean ViT patches per rank step over max_patches (image-text data).
            self.summary["patch_fill"] = (
                _ratio(self.summary["image_patches"], max_patches * rank_steps)
                if max_patches
                else None
            )
            rows = gather_objects(list(report.skipped_sample_ids), trainer.world_size)
            self.summary["skipped_sample_ids"] = sorted(i for row in rows for i in row)
            self.summary.update(_gather_first_epoch_records(trainer, pl_module, report))
        self.summary["not_trained_samples"] = _not_trained_samples(trainer, self.summary)
        if _fixed_size(self.summary):
            # batch_size samples a step whatever their length: no budget to go over.
            self.summary["over_budget_samples"] = None
        for callback in trainer.callbacks:  # on every rank: the entries may gather
            if isinstance(callback, AddsToSummary):
                self.summary.update(callback.summary_entries(trainer, pl_module))
        if trainer.is_global_zero:
            (self.output_dir / "summary.json").write_text(json.dumps(self.summary, indent=2))
            for logger in trainer.loggers:
                # Each figure once: into the run summary where the logger keeps one (W&B),
                # under its summary.json name; as summary/<name> metrics elsewhere (CSV).
                experiment_summary = getattr(getattr(logger, "experiment", None), "summary", None)
                if experiment_summary is not None and hasattr(experiment_summary, "update"):
                    experiment_summary.update(self._numeric())
                else:
                    logger.log_metrics({f"summary/{k}": v for k, v in self._numeric().items()})
            print_summary(self.summary)

    def _gather_totals(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> list[RankTotals]:
        names = [f.name for f in fields(RankTotals)]
        rows = _gather_rows(trainer, pl_module, [float(getattr(self.totals, n)) for n in names])
        return [
            RankTotals(
                **{
                    n: (v if n in ("loader_wait_s", "cost_over_max") else int(v))
                    for n, v in zip(names, row, strict=True)
                }
            )
            for row in rows
        ]

    def _summarize(
        self, trainer: pl.Trainer, per_rank: list[RankTotals], report: RunReport | None
    ) -> dict[str, Any]:
        total = {f.name: sum(getattr(r, f.name) for r in per_rank) for f in fields(RankTotals)}
        wall_s = self._train_s
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
            "padding_efficiency": _ratio(total["real_tokens"], total["padded_tokens"]),
            "budget_fill": _ratio(mean_padded, (token_budget or 0) * steps),
            "rank_imbalance": _ratio(max(padded_per_rank, default=0), mean_padded),
            "wall_s": wall_s,
            "emitted_samples_per_s": _ratio(total["samples"], wall_s),
            "real_tokens_per_s": _ratio(total["real_tokens"], wall_s),
            "padded_tokens_per_s": _ratio(total["padded_tokens"], wall_s),
            "loader_wait_share": _ratio(
                max(r.loader_wait_s for r in per_rank) if per_rank else 0.0, wall_s
            ),
            "train_loss": _metric(trainer, "train/loss"),
            "val_loss": _metric(trainer, "val/loss"),
        }
        summary.update(_sync_figures(per_rank))
        summary["per_rank"] = [asdict(r) for r in per_rank]
        return summary

    def _numeric(self) -> dict[str, float]:
        """The summary's numbers, the ``model`` block's as ``model/<name>``."""
        model = {f"model/{k}": v for k, v in self.summary.get("model", {}).items()}
        return {
            k: float(v)
            for k, v in {**self.summary, **model}.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }


def _sync_figures(per_rank: list[RankTotals]) -> dict[str, float]:
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


def _audit_line(trainer: pl.Trainer, sample_ids: Any) -> dict[str, list]:
    """One step of the id audit: the records' ids (where the data module knows them,
    ``ODBDataModule.record_ids``) and the dataset indices."""
    indices = [int(i) for i in sample_ids]
    record_ids = getattr(getattr(trainer, "datamodule", None), "record_ids", None)
    return {"ids": record_ids(indices) if callable(record_ids) else indices, "indices": indices}


def _metric(trainer: pl.Trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def _run_report(trainer: pl.Trainer) -> RunReport | None:
    """The data module's report of the run, if it gives one (``ODBDataModule`` does)."""
    datamodule = getattr(trainer, "datamodule", None)
    return datamodule.run_report() if isinstance(datamodule, ReportsRun) else None


def _gather_rows(
    trainer: pl.Trainer, pl_module: pl.LightningModule, values: list[float]
) -> list[list[float]]:
    """``values`` of every rank, by rank (one all-gather; every rank must call it)."""
    local = torch.tensor(values, dtype=torch.float64, device=pl_module.device)
    return trainer.strategy.all_gather(local).reshape(-1, len(values)).cpu().tolist()


def _gather_loader_counters(
    trainer: pl.Trainer, pl_module: pl.LightningModule, local: LoaderCounters
) -> dict[str, int]:
    """Every rank's loader counters (dropped, over budget, skipped bad samples) summed;
    alignment rounds are the same on every rank."""
    names = [f.name for f in fields(LoaderCounters)]
    rows = _gather_rows(trainer, pl_module, [float(getattr(local, n)) for n in names])
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
    rows = _gather_rows(trainer, pl_module, local)
    return {
        n: int(sum(row[i] for row in rows))
        for i, n in enumerate(names)
        if all(row[i] >= 0 for row in rows)
    }


def _not_trained_samples(trainer: pl.Trainer, summary: dict[str, Any]) -> int | None:
    """Training samples of the epochs run that no step emitted and that are not counted
    as dropped or skipped: cut by ``limit_train_batches`` (or by ``max_steps``)."""
    train_samples = summary.get("train_samples")
    if train_samples is None:
        return None
    epochs = trainer.fit_loop.epoch_progress.current.started
    accounted = summary.get("emitted_samples", 0) + summary.get("dropped_samples", 0)
    accounted += summary.get("skipped_bad_samples", 0)
    return max(0, train_samples * epochs - accounted)


def format_trainable(model: dict[str, Any]) -> str:
    """``trainable of total (share) finetuning`` of the summary's ``model`` block."""
    trainable, total = model["trainable_parameters"], model["total_parameters"]
    share = _ratio(trainable, total)
    return f"{trainable:,} of {total:,} ({share:.2%}, {model['finetuning']})"


SUMMARY_ROWS: tuple[tuple[str, str, str | Callable[[Any], str]], ...] = (
    ("mode", "mode", "{}"),
    ("world_size", "ranks", "{}"),
    ("model", "trainable parameters", format_trainable),
    ("optimizer_steps", "optimizer steps", "{}"),
    ("emitted_samples", "emitted samples", "{:,}"),
    ("emitted_samples_per_s", "emitted samples/s", "{:.2f}"),
    ("real_tokens_per_s", "real tokens/s", "{:,.0f}"),
    ("padded_tokens_per_s", "padded tokens/s", "{:,.0f}"),
    ("padding_efficiency", "padding efficiency", "{:.3f}"),
    ("budget_fill", "budget fill", "{:.3f}"),
    ("loss_tokens", "supervised tokens", "{:,}"),
    ("idle_steps", "IDLE steps", "{}"),
    ("rank_imbalance", "rank imbalance (max/mean padded)", "{:.3f}"),
    ("sync_efficiency", "sync efficiency (step cost mean/max over ranks)", "{:.3f}"),
    ("utilization", "utilization (useful cost / W x max step cost)", "{:.3f}"),
    ("loader_wait_share", "loader wait share", "{:.3f}"),
    ("tokens_per_s_per_device", "real tokens/s per device", "{:,.0f}"),
    ("model_tflops_per_s_per_device", "model TFLOP/s per device", "{:.3g}"),
    ("mfu", "MFU (dense bf16 peak)", "{:.1%}"),
    ("step_time_mean_s", "step time s (mean over ranks)", "{:.4f}"),
    ("step_time_max_s", "step time s (max over ranks)", "{:.4f}"),
    ("forward_time_mean_s", "forward time s (mean over ranks)", "{:.4f}"),
    ("forward_time_max_s", "forward time s (max over ranks)", "{:.4f}"),
    ("alignment_round_ms_median", "alignment round ms (median)", "{:.2f}"),
    ("alignment_round_ms_p99", "alignment round ms (p99)", "{:.2f}"),
    ("over_budget_samples", "over-budget samples", "{}"),
    ("dropped_samples", "dropped samples", "{}"),
    ("skipped_bad_records", "skipped bad records (source lines)", "{:,}"),
    ("skipped_bad_samples", "skipped bad samples (loader)", "{}"),
    ("not_trained_samples", "not-trained samples", "{:,}"),
    ("unsupervised_samples", "unsupervised records", "{:,}"),
    ("truncated_samples", "truncated records", "{:,}"),
    ("length_cache_s", "length cache build s", "{:.2f}"),
    ("train_loss", "train loss", "{:.4f}"),
    ("val_loss", "val loss (token-weighted)", "{:.4f}"),
    ("wall_s", "train wall s", "{:.1f}"),
)


FIXED_SIZE_LABELS = {"budget_fill": "padded tokens/step / token_budget (no budget in mode)"}
"""Labels of the modes that ignore ``token_budget`` (``standard``, ``sorted``): a step holds
``batch_size`` samples whatever their length, so the ratio may pass 1 with nothing over a
limit (and ``over_budget_samples`` is null)."""


def _fixed_size(summary: dict[str, Any]) -> bool:
    mode = MODES.get(summary.get("mode"))  # type: ignore[arg-type]
    return mode is not None and mode.policy.fixed_size


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The end-of-run table."""
    table = Table(title="odb_lightning run summary", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    fixed_size = _fixed_size(summary)
    for key, label, fmt in SUMMARY_ROWS:
        value = summary.get(key)
        if fixed_size:
            label = FIXED_SIZE_LABELS.get(key, label)
        if value is not None:
            table.add_row(label, fmt(value) if callable(fmt) else fmt.format(value))
    (console or Console()).print(table)
