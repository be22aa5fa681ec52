"""``odb-export``: LoRA adapters and merged models reproduce the trained module's logits,
an FSDP2 checkpoint directory exports the weights its shards hold, the run's tokenizer is
written beside the model, bad input is named."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, Qwen2Config

from helpers.tiny_lm import (
    VOCAB,
    fit_on_cpu,
    qwen2_linears,
    seeded_samples,
    step_batches,
    tiny_module,
)
from helpers.train_run import ROOT, train
from odb_lightning.app.export import (
    ExportError,
    load_run_tokenizer,
    main,
    read_hyperparameters,
    save_tokenizer,
)
from odb_lightning.data import HFTokenizer, QwenTokenizer, export_hf_tokenizer
from odb_lightning.lit.model.module import CausalLMModule

LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0}  # every attention and MLP projection
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_parameter_count(config: Qwen2Config, r: int) -> int:
    """``r x (in + out)`` summed over every adapted Linear of a Qwen2 decoder."""
    shapes = qwen2_linears(
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
    )
    per_layer = sum(r * (n_in + n_out) for n_in, n_out in shapes.values())
    return config.num_hidden_layers * per_layer


def train_and_save(path: Path, **overrides: Any) -> CausalLMModule:
    """Fit a tiny float64 module on four seeded steps in this process; checkpoint it."""
    module = tiny_module(lr=5e-2, scheduler="constant", **overrides)
    steps = [seeded_samples([12, 9, 7], seed=s) for s in range(4)]
    trainer = fit_on_cpu(module, step_batches([steps])[0], max_epochs=1)
    trainer.save_checkpoint(path)
    return module.eval()


def logits(model: nn.Module, input_ids: Tensor) -> Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits


def base_from_checkpoint(path: Path) -> PreTrainedModel:
    """The frozen base of a LoRA checkpoint, read from its state dict without the module."""
    checkpoint = torch.load(path, weights_only=True)
    arguments = checkpoint["hyper_parameters"]["architecture"]
    names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    names += ("num_key_value_heads", "intermediate_size", "tie_word_embeddings")
    config = Qwen2Config(**{n: arguments[n] for n in names})
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    weights = {
        key.removeprefix("model.base_model.model.").replace(".base_layer.", "."): value
        for key, value in checkpoint["state_dict"].items()
        if ".lora_" not in key
    }
    base.load_state_dict(weights)
    return base.eval()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[CausalLMModule, Path]:
    path = tmp_path_factory.mktemp("lora") / "lora.ckpt"
    return train_and_save(path, finetuning="lora", lora=LORA), path


@pytest.fixture(scope="module")
def batch() -> Tensor:
    return torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(7))


def test_only_the_adapters_train_and_the_checkpoint_holds_them(lora_run) -> None:
    module, path = lora_run
    expected = lora_parameter_count(module.random_init, LORA["r"])
    base_total = sum(p.numel() for p in base_from_checkpoint(path).parameters())
    assert module.parameter_counts() == {
        "finetuning": "lora",
        "trainable_parameters": expected,
        "total_parameters": base_total + expected,
    }
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    state = torch.load(path, weights_only=True)["state_dict"]
    adapters = {k: v for k, v in state.items() if ".lora_" in k}
    assert sum(v.numel() for v in adapters.values()) == expected
    assert {k.split(".")[-4] for k in adapters} == set(TARGETS)
    trained = dict(module.state_dict())
    assert all(torch.equal(v, trained[k]) for k, v in adapters.items())
    # B starts at zero: a non-zero B is what the steps trained.
    assert min(v.abs().max() for k, v in adapters.items() if ".lora_B." in k) > 1e-3


def test_adapter_export_loads_onto_its_base_with_the_trained_logits(
    lora_run, batch, tmp_path, capsys
) -> None:
    from peft import PeftModel

    module, path = lora_run
    assert main([str(path), "--out", str(tmp_path / "adapter")]) == 0
    line = capsys.readouterr().out
    expected = lora_parameter_count(module.random_init, LORA["r"])
    assert f"LoRA adapter of {expected:,} parameters" in line
    written = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert "adapter_config.json" in written and "model.safetensors" not in written
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (LORA["r"], LORA["alpha"])
    assert set(config["target_modules"]) == set(TARGETS)
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert sum(t.numel() for t in saved.values()) == expected

    reference = logits(module.model, batch)
    base = base_from_checkpoint(path)
    assert (logits(base, batch) - reference).abs().max() > 1e-3  # the adapters matter
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(adapted, batch), reference, rtol=1e-12, atol=1e-12)


def test_merged_export_is_a_plain_model_with_the_trained_logits(
    lora_run, batch, tmp_path, capsys
) -> None:
    module, path = lora_run
    assert main([str(path), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    counts = module.parameter_counts()
    base_total = counts["total_parameters"] - counts["trainable_parameters"]
    assert f"merged model of {base_total:,} parameters" in capsys.readouterr().out
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert merged.dtype == torch.float64
    assert not any("lora" in name for name in merged.state_dict())
    assert sum(p.numel() for p in merged.parameters()) == base_total
    torch.testing.assert_close(
        logits(merged, batch), logits(module.model, batch), rtol=1e-12, atol=1e-12
    )


def test_adapter_of_a_pretrained_base_names_it_and_loads_onto_it(batch, tmp_path) -> None:
    from peft import PeftModel

    tiny_module().model.save_pretrained(tmp_path / "pretrained")
    module = train_and_save(
        tmp_path / "lora.ckpt",
        pretrained_path=str(tmp_path / "pretrained"),
        finetuning="lora",
        lora=LORA,
    )
    assert main([str(tmp_path / "lora.ckpt"), "--out", str(tmp_path / "adapter")]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "pretrained")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "pretrained").eval()
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    reference = logits(module.model, batch)
    torch.testing.assert_close(logits(adapted, batch), reference, rtol=1e-12, atol=1e-12)


def test_full_finetune_exports_the_whole_model(batch, tmp_path) -> None:
    module = train_and_save(tmp_path / "full.ckpt")
    assert main([str(tmp_path / "full.ckpt"), "--out", str(tmp_path / "model")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    torch.testing.assert_close(logits(exported, batch), logits(module.model, batch), rtol=0, atol=0)


@pytest.fixture(scope="module")
def fsdp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A two-rank FSDP2 run of train.py with the tokenizer's vocabulary (no fold), cut
    short so the 151,936-row LM head stays cheap."""
    run_dir = tmp_path_factory.mktemp("fsdp")
    overrides = (
        "trainer=fsdp_cpu",
        "model.architecture.token_id_fold=null",
        "model.optimizer.lr=1e-2",
    )
    data = ("data.sizes.max_samples=12", "data.sizes.val_samples=0", "data.sizes.max_seq_len=128")
    summary = train(run_dir, *overrides, *data)
    return run_dir / "checkpoints" / "last.ckpt", summary


@pytest.mark.slow  # 2 FSDP2 ranks to make the checkpoint; test_sharded_checkpoints reads one
def test_fsdp2_checkpoint_directory_exports_the_weights_of_its_shards(
    fsdp_checkpoint, tmp_path, capsys
) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    checkpoint, summary = fsdp_checkpoint
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2
    assert main([str(checkpoint), "--out", str(tmp_path / "model")]) == 0
    total = summary["model"]["total_parameters"]
    assert summary["model"]["trainable_parameters"] == total
    assert f"full model of {total:,} parameters" in capsys.readouterr().out

    # torch's own converter is the second path: the shards merged into one file.
    dcp_to_torch_save(checkpoint, tmp_path / "converted.pt")
    shards = torch.load(tmp_path / "converted.pt", weights_only=True)["state_dict"]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    state = exported.state_dict()
    assert sum(p.numel() for p in exported.parameters()) == total
    assert {f"model.{key}" for key in state} == set(shards)
    assert all(torch.equal(state[key.removeprefix("model.")], t) for key, t in shards.items())


def test_token_id_fold_stand_ins_are_refused(tmp_path, capsys) -> None:
    train_and_save(tmp_path / "fold.ckpt", token_id_fold=64)
    assert main([str(tmp_path / "fold.ckpt"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert str(tmp_path / "fold.ckpt") in error and "token_id_fold=64" in error
    assert not (tmp_path / "out").exists()


def test_bad_checkpoints_and_outputs_are_named(lora_run, tmp_path, capsys) -> None:
    _, lora_path = lora_run
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    torch.save({"state_dict": {}}, tmp_path / "bare.ckpt")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    cases = [
        (tmp_path / "missing.ckpt", tmp_path / "a", r"missing\.ckpt does not exist"),
        (tmp_path / "notes.txt", tmp_path / "b", r"notes\.txt is not a torch checkpoint"),
        (tmp_path / "bare.ckpt", tmp_path / "c", r"bare\.ckpt has no 'hyper_parameters'"),
        (tmp_path / "empty_dir", tmp_path / "d", r"empty_dir is a directory but no distrib"),
        (lora_path, tmp_path / "taken", r"--out .*taken exists and is not an empty directory"),
    ]
    for checkpoint, out, message in cases:
        assert main([str(checkpoint), "--out", str(out)]) == 2
        assert re.search(message, capsys.readouterr().err), message
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_a_checkpoint_naming_a_foreign_target_is_not_built(lora_run, tmp_path, capsys) -> None:
    """Building the module instantiates the checkpoint's nodes: only this package's and
    torch.optim's classes may be named, so a crafted checkpoint runs nothing else."""
    _, lora_path = lora_run
    checkpoint = torch.load(lora_path, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["optimizer"]["_target_"] = "os.system"
    torch.save(checkpoint, tmp_path / "crafted.ckpt")
    assert main([str(tmp_path / "crafted.ckpt"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "hyper_parameters.optimizer._target_ is 'os.system'" in error
    assert not (tmp_path / "out").exists()


def test_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["odb-export"] == "odb_lightning.app.export:main"


@pytest.mark.parametrize("kind", ["qwen2", "hf"])
def test_the_runs_tokenizer_is_written_beside_the_model(kind: str, tmp_path: Path) -> None:
    """What the checkpoint's run config names (``tokenizer=qwen2``, ``tokenizer=hf``) is
    read back and written so that ``AutoTokenizer`` encodes as training did."""
    node: dict[str, Any] = {"_target_": "odb_lightning.data.QwenTokenizer"}
    if kind == "hf":
        hf_dir = export_hf_tokenizer(tmp_path / "hf-tokenizer")
        node = {"_target_": "odb_lightning.data.HFTokenizer", "name_or_path": str(hf_dir)}
    checkpoint = tmp_path / "run.ckpt"
    torch.save({"odb_run_config": {"resolved": {"tokenizer": node}}}, checkpoint)
    tokenizer = load_run_tokenizer(checkpoint)
    assert isinstance(tokenizer, HFTokenizer if kind == "hf" else QwenTokenizer)
    out = tmp_path / "exported"
    out.mkdir()
    said = save_tokenizer(tokenizer, out)
    assert said == (f"the run's {hf_dir}" if kind == "hf" else "the run's Qwen2 BPE")
    exported = AutoTokenizer.from_pretrained(out)
    text = "hello there, how are you? Überall 東京"
    assert exported.encode(text, add_special_tokens=False) == tokenizer.encode_text(text)
    assert exported.convert_tokens_to_ids("<|im_end|>") == tokenizer.im_end_id


def test_a_pretrained_checkpoint_is_no_fold_stand_in_whatever_its_preset_said(
    tmp_path: Path,
) -> None:
    """``debug=smoke`` sets ``token_id_fold``; a pretrained model does not use it, so the
    export reads past it (and on to the pretrained directory, here absent)."""
    architecture = {"pretrained_path": str(tmp_path / "base"), "token_id_fold": 4096}
    checkpoint = {"hyper_parameters": {"architecture": architecture}}
    with pytest.raises(ExportError) as error:
        read_hyperparameters(tmp_path / "smoke.ckpt", checkpoint)
    assert "stand-in" not in str(error.value)
    assert "model.architecture.pretrained_path=" in str(error.value)
    architecture["pretrained_path"] = None
    with pytest.raises(ExportError, match="token_id_fold=4096 benchmark stand-in"):
        read_hyperparameters(tmp_path / "smoke.ckpt", checkpoint)
