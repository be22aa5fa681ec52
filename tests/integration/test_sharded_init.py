"""Deferred init under FSDP2: the model is built on ``meta``, sharded per layer, then each
rank allocates and fills its own shard. A local checkpoint is read on rank 0 and scattered;
a random init is the model's own (rotary tables and norms included).

Runs this file as a script under torchrun with 2 gloo ranks; each rank gathers the full
weights after Lightning's setup and the test compares them with the saved checkpoint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import tiny_arguments, tiny_module
from helpers.torchrun import leave_ranks, run_script_on_ranks
from odb_lightning.lit.model.module import CausalLMModule
from testing.harness.sharded_setup import fit_setup_only, one_batch_loader

ROOT = Path(__file__).resolve().parents[2]


class Gather(CausalLMModule):
    """Writes the gathered full weights and the shard sizes once setup is done."""

    def __init__(self, out: str, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.out = Path(out)

    @override
    def on_fit_start(self) -> None:
        super().on_fit_start()
        full = {k: v.full_tensor().clone() for k, v in self.model.state_dict().items()}
        buffers = {k: v.clone() for k, v in self.model.named_buffers()}
        local = sum(p.to_local().numel() for p in self.parameters())
        record = {"weights": full, "buffers": buffers, "local": local}
        local_weights = {k: v.to_local().clone() for k, v in self.model.state_dict().items()}
        record["local_weights"] = local_weights
        tag = self.finetuning.method.value if self.architecture.pretrained_path else "random"
        torch.save(record, self.out / f"{tag}_rank{self.global_rank}.pt")

    @override
    def train_dataloader(self) -> DataLoader:
        return one_batch_loader()


def setup_on_both_ranks(pretrained: str | None, out: str, finetuning: str) -> None:
    arguments = tiny_arguments(pretrained_path=pretrained, decay_steps=1, finetuning=finetuning)
    fit_setup_only(Gather(out, **arguments))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CausalLMModule]:
    base = tmp_path_factory.mktemp("sharded_init")
    source = tiny_module(tie_word_embeddings=True)
    source.model.save_pretrained(base / "pretrained")
    # A checkpoint that lacks one layer's weights.
    from safetensors.torch import load_file, save_file

    source.model.save_pretrained(base / "broken")
    weights = load_file(base / "broken" / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, base / "broken" / "model.safetensors", metadata={"format": "pt"})
    run_script_on_ranks(__file__, str(base / "pretrained"), str(base), str(base / "broken"))
    return base, source


def test_a_local_checkpoint_is_scattered_to_the_shards(sharded) -> None:
    base, source = sharded
    expected = source.model.state_dict()
    for rank in range(2):
        record = torch.load(base / f"full_rank{rank}.pt", weights_only=True)
        assert record["weights"].keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(record["weights"][name], tensor), name
        total = sum(p.numel() for p in source.model.parameters())
        assert record["local"] < total  # a shard, not a replica
        # Rotary tables are no checkpoint's: recomputed, equal to the eager build's.
        for name, tensor in source.model.named_buffers():
            assert torch.equal(record["buffers"][name], tensor), name


def test_lora_on_a_sharded_checkpoint_keeps_the_base_and_starts_at_it(sharded) -> None:
    base, source = sharded
    expected = source.model.state_dict()
    record = torch.load(base / "lora_rank0.pt", weights_only=True)
    weights = record["weights"]
    adapters = {k for k in weights if "lora_" in k}
    assert adapters and all("lora_A" in k or "lora_B" in k for k in adapters)
    for name, tensor in weights.items():
        if "lora_B" in name:
            assert torch.count_nonzero(tensor) == 0, name  # LoRA starts as the identity
        elif "lora_A" in name:
            assert torch.count_nonzero(tensor) > 0, name
        else:
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(tensor, expected[plain]), name


def broken_checkpoint_fails_on_every_rank(broken: str, out: str) -> None:
    try:
        setup_on_both_ranks(broken, out, "full")
    except ValueError as error:
        rank = int(os.environ["RANK"])
        (Path(out) / f"broken_rank{rank}.txt").write_text(str(error))


if __name__ == "__main__":
    pretrained_dir, out_dir = sys.argv[1], sys.argv[2]
    setup_on_both_ranks(pretrained_dir, out_dir, "full")
    setup_on_both_ranks(pretrained_dir, out_dir, "lora")
    setup_on_both_ranks(None, out_dir, "full")
    broken_checkpoint_fails_on_every_rank(sys.argv[3], out_dir)
    leave_ranks()


def test_random_init_fills_each_shard_as_the_model_initialises_itself(sharded) -> None:
    base, source = sharded
    ranks = [torch.load(base / f"random_rank{r}.pt", weights_only=True) for r in range(2)]
    weights = ranks[0]["weights"]
    assert weights.keys() == source.model.state_dict().keys()
    std = source.model.config.initializer_range
    for name, tensor in weights.items():
        assert torch.isfinite(tensor).all(), name
        if name.endswith("norm.weight"):
            assert torch.equal(tensor, torch.ones_like(tensor)), name
        elif name.endswith("proj.weight") or "embed" in name:
            assert abs(float(tensor.std()) - std) < 0.25 * std, name
    # Each rank drew its own shard: the two halves of a matrix differ.
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(ranks[0]["local_weights"][q], ranks[1]["local_weights"][q])
    for name, tensor in source.model.named_buffers():  # rotary tables recomputed
        assert torch.equal(ranks[0]["buffers"][name], tensor), name


def test_a_checkpoint_missing_a_weight_fails_every_rank_naming_it(sharded) -> None:
    base, _ = sharded
    for rank in range(2):
        message = (base / f"broken_rank{rank}.txt").read_text()
        assert "model.layers.1.mlp.down_proj.weight" in message, message
        assert "model.architecture.pretrained_path" in message
