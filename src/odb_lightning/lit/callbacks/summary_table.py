"""The end-of-run table of the run summary (``summary.json``'s figures, labelled)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from odb_lightning.core.modes import MODES


def format_trainable(model: dict[str, Any]) -> str:
    """``trainable of total (share) finetuning`` of the summary's ``model`` block."""
    trainable, total = model["trainable_parameters"], model["total_parameters"]
    share = trainable / total if total else 0.0
    return f"{trainable:,} of {total:,} ({share:.2%}, {model['finetuning']})"


def _kib(value: float) -> str:
    return f"{value / 1024:,.1f}"


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
    ("image_patches", "image patches (ViT, emitted)", "{:,}"),
    ("patch_fill", "patch fill (patches per rank step / max_patches)", "{:.3f}"),
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
    ("moved_samples", "moved samples (cross-rank grouping)", "{:,}"),
    ("moved_samples_per_rank_step", "moved samples per rank step", "{:.2f}"),
    ("moved_bytes_per_rank_step", "moved KiB per rank step (on the wire)", _kib),
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


IMAGE_ROWS = frozenset({"image_patches"})
"""Rows shown only for image-text runs (those with ``patch_fill``): a text run's count is 0."""


def is_fixed_size(summary: dict[str, Any]) -> bool:
    """The run's mode cuts batches of ``batch_size`` samples: no token budget to fill."""
    mode = MODES.get(summary.get("mode"))  # type: ignore[arg-type]
    return mode is not None and mode.policy.fixed_size


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The end-of-run table."""
    table = Table(title="odb_lightning run summary", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    fixed_size = is_fixed_size(summary)
    for key, label, fmt in SUMMARY_ROWS:
        value = summary.get(key)
        if key in IMAGE_ROWS and summary.get("patch_fill") is None:
            continue
        if key.startswith("moved_") and not summary.get("moved_samples"):
            continue  # only runs that group across ranks
        if fixed_size:
            label = FIXED_SIZE_LABELS.get(key, label)
        if value is not None:
            table.add_row(label, fmt(value) if callable(fmt) else fmt.format(value))
        if key == "emitted_samples":  # what each part of a mixture trained, below the total
            for part, row in (summary.get("mixture_trained") or {}).items():
                share = f" ({row['share']:.1%})" if row["share"] is not None else ""
                trained = f"{row['samples']:,}{share}, {row['tokens']:,} tokens"
                table.add_row(f"  of them from {part}", trained)
    (console or Console()).print(table)
