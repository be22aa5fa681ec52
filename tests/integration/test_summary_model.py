"""The run summary's ``model`` block: trainable and total parameters of a LoRA run of
train.py, counted here from the architecture alone, and its row in the summary table."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from helpers.tiny_lm import qwen2_linears
from helpers.train_run import train
from odb_lightning.lit.callbacks.summary_table import print_summary

LORA_R = 4


def layer_linears(model: dict) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each projection of one decoder layer of ``model``."""
    return qwen2_linears(
        model["hidden_size"],
        model["num_attention_heads"],
        model["num_key_value_heads"],
        model["intermediate_size"],
    )


def base_parameter_count(model: dict) -> int:
    """Embeddings (the tied head counted once), projections with Qwen2's q/k/v biases,
    two norms per layer and the final norm."""
    assert model["tie_word_embeddings"]
    vocab, hidden = model["token_id_fold"] or model["vocab_size"], model["hidden_size"]
    linears = layer_linears(model)
    biases = sum(linears[name][1] for name in ("q_proj", "k_proj", "v_proj"))
    per_layer = sum(i * o for i, o in linears.values()) + biases + 2 * hidden
    return vocab * hidden + model["num_hidden_layers"] * per_layer + hidden


def lora_parameter_count(model: dict, r: int) -> int:
    per_layer = sum(r * (i + o) for i, o in layer_linears(model).values())
    return model["num_hidden_layers"] * per_layer


@pytest.mark.slow  # LoRA's trainable count is checked in-process in tests/unit/lit/test_model_setup
def test_lora_run_summary_counts_only_the_adapters_as_trainable(tmp_path: Path) -> None:
    lora = ("model.finetuning.method=lora", f"model.finetuning.lora.r={LORA_R}")
    summary = train(tmp_path, *lora, "data.sizes.max_samples=24", "data.sizes.val_samples=0")
    config = OmegaConf.load(tmp_path / ".hydra" / "config.yaml")
    model = OmegaConf.to_container(config.model.architecture)
    adapters = lora_parameter_count(model, LORA_R)
    assert summary["model"] == {
        "finetuning": "lora",
        "trainable_parameters": adapters,
        "total_parameters": base_parameter_count(model) + adapters,
    }
    assert 0 < adapters < summary["model"]["total_parameters"]
    # The loggers get the counts too, as summary/model/<name>.
    (metrics,) = tmp_path.glob("csv/*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    logged = [r["summary/model/trainable_parameters"] for r in rows]
    assert [float(v) for v in logged if v] == [adapters]


def test_summary_table_shows_trainable_of_total_parameters() -> None:
    console = Console(record=True, width=120)
    model = {"finetuning": "lora", "trainable_parameters": 8192, "total_parameters": 148640}
    print_summary({"mode": "odb", "world_size": 1, "model": model}, console)
    (row,) = [line for line in console.export_text().splitlines() if "trainable" in line]
    assert "trainable parameters" in row and "8,192 of 148,640 (5.51%, lora)" in row
    console = Console(record=True, width=120)
    print_summary({"mode": "odb", "world_size": 1}, console)  # a module that counts nothing
    assert "trainable" not in console.export_text()
