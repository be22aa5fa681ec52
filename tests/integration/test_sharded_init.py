"""Deferred init under FSDP2: the model is built on ``meta``, sharded per layer, then each
rank allocates and fills its own shard. A local checkpoint is read on rank 0 and scattered;
a random init is the model's own (rotary tables and norms included).

Runs this file as a script under torchrun with 2 gloo ranks; each rank gathers the full
weights after Lightning's setup and the test compares them with the saved checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import tiny_arguments, tiny_module
from odb_lightning.lit.fsdp2 import FSDP2Strategy
from odb_lightning.lit.module import CausalLMModule

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
        torch.save(record, self.out / f"{self.hparams.finetuning}_rank{self.global_rank}.pt")

    @override
    def train_dataloader(self) -> DataLoader:
        return DataLoader([torch.zeros(1)])


def setup_on_both_ranks(pretrained: str, out: str, finetuning: str) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=FSDP2Strategy(process_group_backend="gloo"),
        limit_train_batches=0,
        limit_val_batches=0,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    arguments = tiny_arguments(pretrained_path=pretrained, decay_steps=1, finetuning=finetuning)
    trainer.fit(Gather(out, **arguments))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CausalLMModule]:
    base = tmp_path_factory.mktemp("sharded_init")
    source = tiny_module(tie_word_embeddings=True)
    source.model.save_pretrained(base / "pretrained")
    leaks = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in leaks}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), env.get("PYTHONPATH")]))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*torchrun, str(Path(__file__).resolve()), str(base / "pretrained"), str(base)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
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


if __name__ == "__main__":
    setup_on_both_ranks(sys.argv[1], sys.argv[2], "full")
    setup_on_both_ranks(sys.argv[1], sys.argv[2], "lora")
