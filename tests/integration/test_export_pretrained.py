"""``odb-export`` of a ``debug=smoke model=pretrained`` checkpoint: the smoke preset's
``token_id_fold`` is not in effect on a pretrained model, so it is exported, with the
run's tokenizer beside it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from helpers.train_run import train
from odb_lightning.app.export import main
from odb_lightning.data import HFTokenizer, export_hf_tokenizer


@pytest.mark.slow
def test_a_smoke_run_of_a_pretrained_model_exports_with_its_tokenizer(tmp_path: Path) -> None:
    model_dir = export_hf_tokenizer(tmp_path / "tiny-qwen2")
    config = Qwen2Config(
        vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    run_dir = tmp_path / "run"
    train(
        run_dir, "model=pretrained", f"model.architecture.pretrained_path={model_dir}",
        "model.runtime.activation_checkpointing=false", "tokenizer=hf",
        f"tokenizer.name_or_path={model_dir}", "data.sizes.max_samples=24",
    )  # fmt: skip
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["hyper_parameters"]["architecture"]
    assert saved["token_id_fold"] == 4096  # the preset's, unused with pretrained_path
    out = tmp_path / "exported"
    assert main([str(checkpoint), "--out", str(out)]) == 0
    exported, trained = AutoTokenizer.from_pretrained(out), HFTokenizer(model_dir)
    text = "hello there, how are you?"
    assert exported.encode(text, add_special_tokens=False) == trained.encode_text(text)
    assert exported.convert_tokens_to_ids("<|im_end|>") == trained.im_end_id
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 151936
