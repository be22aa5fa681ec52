"""Online dynamic batching in a plain PyTorch loop, one process or several under torchrun.

    python examples/plain_loop.py                                  # one process
    torchrun --standalone --nproc_per_node=2 examples/plain_loop.py   # 2 ranks, DDP (gloo)
    python examples/plain_loop.py --jsonl my_chats.jsonl --tokenizer /models/Qwen2.5-0.5B

The sample format. ``ODBLoader`` takes any map-style dataset whose items are
``{"input_ids": LongTensor[L], "labels": LongTensor[L]}`` (1-D). ``ChatDataset`` makes them
from conversations with the tokenizer's chat template, in the loader's worker processes.
Labels follow the Hugging Face convention: ``-100`` where there is no loss (system and
user turns, role headers), the token id where there is (assistant content and its
end-of-turn token); the model shifts them, so position ``t`` is scored against
``labels[t + 1]``. Rows are right-padded with the tokenizer's ``pad_id`` (its pad token,
else its end-of-text token), which ``tokenizer.pad_id`` gives; ``attention_mask`` is 1 on
real tokens.

The loss. Each batch's summed token loss is scaled by ``world_size / global_loss_tokens``
(the supervised tokens of this step over all ranks, from the batch's metadata): DDP then
averages the gradients into exactly the gradient of the mean over every supervised token
of the step, however unevenly the ranks' batches are filled. An IDLE batch (a rank whose
shard ran out) is a zero-weight step: forward and backward still run, so DDP's
all-reduce stays in step.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import Qwen2Config, Qwen2ForCausalLM

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.loss_weights import rank_loss_scale
from odb_lightning.data import IGNORE_INDEX, ChatDataset, load_tokenizer
from odb_lightning.data.sources.jsonl import jsonl_records
from odb_lightning.runtime import ODBLoader


def toy_records(count: int) -> list[dict]:
    """Conversations of varied length, standing in for your data (``--jsonl``)."""
    return [
        {
            "id": f"toy-{k}",
            "messages": [
                {"role": "user", "content": f"Count to {k % 23 + 1}, please."},
                {"role": "assistant", "content": " ".join(str(n) for n in range(k % 23 + 1))},
            ],
        }
        for k in range(count)
    ]


class SupervisedTokenLoss(nn.Module):
    """A causal LM whose forward returns the summed cross-entropy of the supervised
    tokens: the LM head runs only on positions that have a target (no full logits)."""

    def __init__(self, model: Qwen2ForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, labels) -> torch.Tensor:
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask)
        targets = labels[:, 1:]  # position t predicts token t + 1
        supervised = targets != IGNORE_INDEX
        logits = self.model.lm_head(hidden.last_hidden_state[:, :-1][supervised])
        return F.cross_entropy(logits.float(), targets[supervised], reduction="sum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jsonl", type=Path, help="your conversations (default: toy ones)")
    parser.add_argument("--tokenizer", default="qwen2.5", help="qwen2.5 or an HF directory")
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write each rank's steps_rank<r>.json here")
    args = parser.parse_args()

    # Under torchrun: one process per rank, gloo on CPU (nccl on GPUs).
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(0)  # the same initial weights on every rank

    tokenizer = load_tokenizer(args.tokenizer)
    records = jsonl_records(args.jsonl).records if args.jsonl else toy_records(48)
    dataset = ChatDataset(records, tokenizer, max_seq_len=args.max_seq_len)
    config = Qwen2Config(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model: nn.Module = SupervisedTokenLoss(Qwen2ForCausalLM(config))
    if world_size > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    batching = BatchingConfig.of(
        token_budget=args.token_budget, outstanding_depth=32, num_workers=1, seed=0
    )
    steps = []
    # The loader finds the default process group itself: every rank yields the same
    # number of batches per epoch, and together they emit every sample once.
    with ODBLoader(
        dataset, batching, pad_id=tokenizer.pad_id, max_seq_len=args.max_seq_len
    ) as loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                meta = batch.meta
                inputs = batch.inputs  # input_ids, attention_mask, labels: [rows, longest]
                loss_sum = model(**inputs)
                scale = (
                    0.0 if meta.is_idle else rank_loss_scale(world_size, meta.global_loss_tokens)
                )
                (loss_sum * scale).backward()  # IDLE: zero weight, the same collectives
                optimizer.step()
                optimizer.zero_grad()
                local_loss = float(loss_sum.detach()) / max(meta.local_loss_tokens, 1)
                steps.append({"epoch": epoch, "ids": list(meta.sample_ids), "idle": meta.is_idle})
                if rank == 0:
                    print(
                        f"epoch {epoch} step {meta.step}: {meta.local_samples} samples, "
                        f"{meta.local_padded_tokens} padded tokens, loss {local_loss:.3f}"
                    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"rank": rank, "world_size": world_size, "steps": steps}
        (args.out / f"steps_rank{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
