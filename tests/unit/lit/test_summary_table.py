"""The end-of-run table's budget rows: modes that cut batches of ``batch_size`` samples
(``standard``, ``sorted``) have no token budget to fill or go over."""

from __future__ import annotations

import pytest
from rich.console import Console

from odb_lightning.lit.callbacks.summary_table import print_summary


def table_rows(summary: dict) -> dict[str, str]:
    console = Console(record=True, width=120)
    print_summary(summary, console)
    rows = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.parametrize("mode", ["standard", "sorted"])
def test_fixed_size_modes_show_the_ratio_without_calling_it_a_fill(mode: str) -> None:
    # What on_train_end leaves for these modes: over_budget_samples is null.
    rows = table_rows({"mode": mode, "budget_fill": 1.911, "over_budget_samples": None})
    assert rows["padded tokens/step / token_budget (no budget in mode)"] == "1.911"
    assert "budget fill" not in rows and "over-budget samples" not in rows


@pytest.mark.parametrize("mode", ["odb", "bucketed", "oracle", "odb_packed"])
def test_budget_modes_show_fill_and_over_budget_samples(mode: str) -> None:
    rows = table_rows({"mode": mode, "budget_fill": 0.915, "over_budget_samples": 2})
    assert rows["budget fill"] == "0.915" and rows["over-budget samples"] == "2"


def test_image_text_runs_show_their_image_figures() -> None:
    rows = table_rows({"mode": "odb", "image_patches": 12_288, "patch_fill": 0.812})
    assert rows["image patches (ViT, emitted)"] == "12,288"
    assert rows["patch fill (patches per rank step / max_patches)"] == "0.812"
    # A text run (no patch fill) does not show a count of 0 patches.
    rows = table_rows({"mode": "odb", "image_patches": 0, "patch_fill": None})
    assert not any(label.startswith(("image patches", "patch fill")) for label in rows)


def test_a_mixture_shows_what_each_part_trained_below_the_total() -> None:
    trained = {
        "a.jsonl": {"samples": 60, "tokens": 1_230, "share": 0.75},
        "b.json": {"samples": 20, "tokens": 410, "share": 0.25},
    }
    rows = table_rows({"mode": "odb", "emitted_samples": 80, "mixture_trained": trained})
    assert rows["emitted samples"] == "80"
    assert rows["of them from a.jsonl"] == "60 (75.0%), 1,230 tokens"
    assert rows["of them from b.json"] == "20 (25.0%), 410 tokens"


def test_a_run_that_moved_samples_shows_them_per_rank_step() -> None:
    moved = {"moved_samples": 300, "moved_samples_per_rank_step": 1.5}
    rows = table_rows({"mode": "odb", **moved, "moved_bytes_per_rank_step": 20_480.0})
    assert rows["moved samples (cross-rank grouping)"] == "300"
    assert rows["moved samples per rank step"] == "1.50"
    assert rows["moved KiB per rank step (on the wire)"] == "20.0"
    # A run that moved nothing (one rank, or grouping per rank) shows none of them.
    rows = table_rows({"mode": "odb", "moved_samples": 0, "moved_bytes_per_rank_step": 0.0})
    assert not any(label.startswith("moved") for label in rows)
