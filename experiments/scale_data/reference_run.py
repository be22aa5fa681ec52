"""The reference package's loader (``online-dynamic-batching``) on a chat JSON Lines file,
used the way its README shows: a map-style dataset, ``odb.ODBDataLoader``, a plain loop.

One process per rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in the
environment, as ``torchrun`` sets them; gloo and ``DistributedDataParallel`` with several).
What a user of the package writes themselves is done the plain way: the file is read into a
list of parsed records (the package reads no files), each record is tokenized in the
loader's workers with the same ChatML template and Qwen2.5 tokenizer as ``train.py``, and
the model is the ``model=cpu_bench`` architecture (token ids folded modulo 2,048) trained
with AdamW on ``loss`` of ``transformers``' causal-LM head. The package gets the same
token budget, workers and seed as ``train.py``; its window (``buffer_size``) and its
warm-up are its own defaults.

Each rank writes ``startup_rank{r}.json`` in ``--output-dir`` with the same marks as
:mod:`experiments.scale_data.probe`.
"""

from __future__ import annotations

import os
import time

START = time.time()

import argparse  # noqa: E402  (the clock starts before the imports, as a process's does)
import functools  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import Dataset, DistributedSampler  # noqa: E402

FOLD = 2048  # model=cpu_bench's token_id_fold


class JsonlChats(Dataset):
    """The records of a JSON Lines file, tokenized on access (in the loader workers)."""

    def __init__(self, path: Path, max_seq_len: int) -> None:
        from odb_lightning.data import QwenTokenizer
        from odb_lightning.data.template_choice import build_chat_template

        with path.open(encoding="utf-8") as lines:
            self.records = [json.loads(line) for line in lines if line.strip()]
        self.template = build_chat_template(QwenTokenizer(), "auto")
        self.max_seq_len = max_seq_len

    def __len__(self) -> int:
        return len(self.records)

    def pop(self) -> JsonlChats:
        """Itself. torch >= 2.14's worker loop takes its dataset out of a one-item list
        (``dataset_holder.pop()``); the package's 0.1.2 worker start passes the dataset
        itself, so without this its workers die at start. No work in the timed region."""
        return self

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        chat = self.template.tokenize(self.records[index]["messages"], self.max_seq_len)
        return {
            "input_ids": torch.tensor(chat.input_ids, dtype=torch.long),
            "labels": torch.tensor(chat.labels, dtype=torch.long),
        }


def build_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from odb_lightning.lit.model.config import Architecture

    sizes = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1}
    config = Architecture(**sizes, intermediate_size=512, token_id_fold=FOLD).random_init()
    return AutoModelForCausalLM.from_config(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--token-budget", type=int, required=True)
    parser.add_argument("--max-seq-len", type=int, required=True)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import odb  # the comparator: imported only by the studies

    from odb_lightning.runtime.batch import pad_collate

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    marks: dict[str, float] = {"process_start": psutil.Process().create_time()}
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = build_model()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    dataset = JsonlChats(args.path, args.max_seq_len)
    sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=args.seed)
    loader = odb.ODBDataLoader(
        dataset,
        token_budget=args.token_budget,
        num_workers=args.num_workers,
        sampler=sampler,
        collate_fn=functools.partial(pad_collate, pad_id=0),
    )
    marks["first_batch_requested"] = time.time()
    steps = 0
    for batch in loader:
        odb.pop_step_info(batch, loss_scaling="none")
        marks.setdefault("first_batch", time.time())
        labels = batch["labels"]
        folded = torch.where(labels >= 0, labels % FOLD, labels)  # -100 stays ignored
        inputs: dict[str, Any] = {"input_ids": batch["input_ids"] % FOLD, "labels": folded}
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        marks.setdefault("first_step", time.time())
        if steps == args.max_steps:
            break
    marks["train_end"] = time.time()
    marks["import_start"] = START
    out = args.output_dir / f"startup_rank{rank}.json"
    out.write_text(json.dumps({"marks": marks, "batches": steps}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
