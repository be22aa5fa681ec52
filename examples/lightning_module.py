"""Your own LightningModule with online dynamic batching: ``TokenWeightedLossMixin`` gives
the exact token-weighted loss, ``ODBDataModule`` the data, batches and rank alignment.

    python examples/lightning_module.py                        # toy data, tiny model, CPU
    python examples/lightning_module.py --jsonl my_chats.jsonl --devices 2   # 2-rank DDP

What the module must do, and nothing more: ``training_step`` sums the token losses of the
supervised positions (``reduction="sum"``, shifted labels ``!= -100``) and returns
``self.token_weighted_loss(loss_sum, num_loss_tokens, batch.meta)``; the mixin scales the
gradients by the global supervised-token count of the optimizer step (over ranks and
accumulated micro-batches), and makes IDLE batches zero-weight steps. The data module
hands the trainer ``ODBBatch`` objects: ``batch.inputs`` are the model inputs
(``input_ids``, ``attention_mask``, ``labels``), ``batch.meta`` the step's counts.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM
from typing_extensions import override

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import IGNORE_INDEX, load_tokenizer
from odb_lightning.lit.data.datamodule import ODBDataModule
from odb_lightning.lit.model.loss import TokenWeightedLossMixin


class MyCausalLM(TokenWeightedLossMixin, pl.LightningModule):
    """A small causal LM trained on the supervised tokens only."""

    def __init__(self, vocab_size: int, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        config = Qwen2Config(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        )  # fmt: skip
        self.model = Qwen2ForCausalLM(config)

    def loss_sum(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy of the supervised tokens, and how many there are."""
        hidden = self.model.model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).last_hidden_state
        targets = inputs["labels"][:, 1:]  # position t predicts token t + 1
        supervised = targets != IGNORE_INDEX
        logits = self.model.lm_head(hidden[:, :-1][supervised])
        loss = F.cross_entropy(logits.float(), targets[supervised], reduction="sum")
        return loss, int(supervised.sum())

    @override
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss_sum, num_loss_tokens = self.loss_sum(batch.inputs)
        return self.token_weighted_loss(loss_sum, num_loss_tokens, batch.meta)

    @override
    def validation_step(self, batch, batch_idx: int) -> None:
        loss_sum, num_loss_tokens = self.loss_sum(batch.inputs)
        if num_loss_tokens and not batch.meta.is_idle:
            # Per-batch mean weighted by its tokens: Lightning's epoch mean is then the
            # token-weighted mean over the whole validation set.
            self.log("val/loss", loss_sum / num_loss_tokens, batch_size=num_loss_tokens)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def write_toy_jsonl(path: Path, count: int) -> Path:
    """Conversations of varied length standing in for your data (``--jsonl``), one
    ``{"id", "messages": [{"role", "content"}]}`` per line, as ``data=jsonl`` reads them."""
    if not path.exists():  # under DDP every rank runs this: write once, atomically
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps({
                "id": f"toy-{k}",
                "messages": [
                    {"role": "user", "content": f"Count to {k % 23 + 1}, please."},
                    {"role": "assistant", "content": " ".join(map(str, range(k % 23 + 1)))},
                ],
            })
            for k in range(count)
        ]  # fmt: skip
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        partial.replace(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jsonl", type=Path, help="your conversations (default: toy ones)")
    parser.add_argument("--tokenizer", default="qwen2.5", help="qwen2.5 or an HF directory")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (DDP if > 1)")
    parser.add_argument("--max-epochs", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the final metrics here (JSON)")
    args = parser.parse_args()
    if args.jsonl is None:
        args.jsonl = write_toy_jsonl(Path("outputs/examples/toy_chats.jsonl"), 48)

    tokenizer = load_tokenizer(args.tokenizer)
    batching = BatchingConfig.of(token_budget=1024, outstanding_depth=32, num_workers=1, seed=0)
    data = ODBDataModule.of(
        tokenizer, batching, name="jsonl", path=str(args.jsonl), max_seq_len=256, val_samples=0.1
    )
    model = MyCausalLM(tokenizer.vocab_size)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.max_epochs,
        logger=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
    )
    trainer.fit(model, datamodule=data)
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    if trainer.is_global_zero:
        print(f"optimizer steps {trainer.global_step}, metrics {metrics}")
        if args.out is not None:
            args.out.write_text(json.dumps({"global_step": trainer.global_step, **metrics}))


if __name__ == "__main__":
    main()
