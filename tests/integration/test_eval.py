"""A new user's path end to end: their own jsonl, their own small Hugging Face model with a
non-ChatML tokenizer (Llama 3), ``debug=smoke`` on the pretrained path, then ``eval.py``
on the checkpoint, whose loss equals the training run's validation loss."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.chat_tokenizers import write_llama3_tokenizer
from helpers.own_data import write_own_jsonl
from helpers.train_run import ROOT


def write_tiny_llama(out_dir: Path) -> Path:
    """A randomly initialised one-layer Llama with the Llama 3 vocabulary and tokenizer,
    saved as a user's model directory would be."""
    from transformers import LlamaConfig, LlamaForCausalLM

    write_llama3_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128009,
    )
    LlamaForCausalLM(config).save_pretrained(str(out_dir))
    return out_dir


def _run(script: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, script, *overrides], cwd=ROOT, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("own_model")
    model = write_tiny_llama(root / "tiny-llama")
    data = root / "mine.jsonl"
    write_own_jsonl(data, num_short=18, num_long=2)
    run_dir = root / "run"
    done = _run(
        "train.py",
        f"hydra.run.dir={run_dir}",
        "debug=smoke",
        "data=jsonl",
        f"data.source.path={data}",
        "batching.loader.on_bad_sample=skip",
        "model=pretrained",
        f"model.architecture.pretrained_path={model}",
        "model.runtime.activation_checkpointing=false",
        "tokenizer=hf",
        f"tokenizer.name_or_path={model}",
    )
    # from_pretrained returns eval mode; the module trains in train mode, unwarned.
    assert "in eval mode" not in done.stdout + done.stderr
    assert "in eval mode" not in (run_dir / "train.log").read_text()
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def test_eval_of_the_checkpoint_matches_the_runs_val_loss(
    trained: tuple[Path, dict], tmp_path: Path
) -> None:
    run_dir, summary = trained
    assert summary["template"] == "llama3"  # data.source.template=auto read the tokenizer's own
    assert summary["train_samples"] == 16 and summary["val_loss"] > 0
    done = _run(
        "eval.py", f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={tmp_path}"
    )
    result = json.loads((tmp_path / "eval.json").read_text())
    # The config came from the checkpoint: the same 4 held-out records, the same model.
    assert result["split"] == "val" and result["samples"] == 4
    assert result["loss"] == pytest.approx(summary["val_loss"], rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert result["loss_tokens"] > 0
    assert "odb_lightning evaluation" in done.stdout
    assert f"eval.json: {tmp_path / 'eval.json'}" in done.stdout
    # It evaluates with the checkpoint's config; it does not say it resumes anything.
    log = done.stdout + done.stderr
    assert "evaluating with the config saved in" in log and "resuming" not in log


@pytest.mark.slow
def test_eval_on_the_training_split(trained: tuple[Path, dict], tmp_path: Path) -> None:
    run_dir, summary = trained
    _run(
        "eval.py",
        f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
        "split=train",
        f"hydra.run.dir={tmp_path}",
    )
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["samples"] == summary["train_samples"]
    # Every supervised token of the training records, once (the run emitted each once).
    assert result["loss_tokens"] == summary["loss_tokens"]


def test_unknown_split_is_a_config_error_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from omegaconf import OmegaConf

    from odb_lightning.app.evaluate import main

    cfg = OmegaConf.create(
        {"ckpt_path": str(tmp_path / "last.ckpt"), "split": "test", "paths": {"output_dir": "x"}}
    )
    with pytest.raises(SystemExit) as exit_info:  # refused before the checkpoint is read
        main(cfg)
    assert exit_info.value.code == 1
    assert "invalid config 'split': split must be one of val, train, all, got 'test'" in (
        caplog.text
    )
    assert "Traceback" not in caplog.text
