"""Another model family is a config change: a random-init Llama trains in ``debug=smoke``
through ``transformers.AutoConfig.for_model``, with nothing of Qwen2 in it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.train_run import train


@pytest.mark.slow
def test_a_random_init_llama_trains_in_debug_smoke_by_config_alone(tmp_path: Path) -> None:
    summary = train(tmp_path, "model=tiny_llama")
    assert summary["emitted_samples"] == 64 == summary["train_samples"]
    assert summary["optimizer_steps"] > 0 and summary["train_loss"] > 0
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["architecture"]["model_type"] == "llama"
    weights = checkpoint["state_dict"]
    # debug=smoke: one layer, 32 wide, ids folded to 4,096; Llama's own module names.
    assert weights["model.model.embed_tokens.weight"].shape == (4096, 32)
    assert "model.model.layers.0.mlp.gate_proj.weight" in weights
    assert not any(key.startswith("model.model.layers.1.") for key in weights)
