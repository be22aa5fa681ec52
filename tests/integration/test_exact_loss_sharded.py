"""Exact token-weighted loss beyond plain DDP: FSDP2 shards, LoRA adapters.

SPEC 3.3 again (``test_exact_loss_ddp.py`` holds it for full fine-tuning under DDP): an
N-rank dynamic run with accumulation produces the gradient of one process on the union
batch (relative error <= 1e-5 in float64), here

- under FSDP2 (:class:`~odb_lightning.lit.model.fsdp2.FSDP2Strategy`: every decoder layer and
  the LightningModule sharded, parameters and gradients ``DTensor`` shards), full
  fine-tuning and LoRA;
- with LoRA adapters under DDP (only the adapters train; the frozen base weights are part
  of the reference's parameters, the gradient is compared on the adapters only).

The micro-batches are those of ``test_exact_loss_ddp.py``: local batch sizes differ
between the ranks at every position, and rank 1's micro-batch 1 is IDLE with supervised
labels that must count for nothing.

How it runs: in the session's one exact-loss job (``exact_loss_job.py``: 2 gloo ranks
under torchrun, every fit one after the other in the same process group), the ``ddp``
launch fits LoRA, the ``fsdp2`` launch full fine-tuning and LoRA (accumulation 2 each).
Each module trains with ``SGD(lr=1)`` and no clipping and records, at every optimizer
step, its whole parameters (FSDP2 shards gathered with ``full_tensor``) and the whole
gradient of its trainable parameters after the mixin's ``1 / N`` scale, then its
parameters after the last step. A step's gradient is checked as captured and as
``params_k - params_{k+1}`` (the update the optimizer applied) against the gradient of
the global per-token mean over the union of that step's micro-batches, computed in the
test process at the recorded ``params_k`` (so the initial weights need not match
anything).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, Strategy
from test_exact_loss_ddp import IDLE, SAMPLES, WORLD_SIZE, rank_batches
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import (
    gathered_params,
    gathered_trainable_grad,
    hand_over,
    make_sample,
    quiet_trainer,
    rel_err,
    tiny_arguments,
    union_gradient,
)
from odb_lightning.lit.model.fsdp2 import FSDP2Strategy
from odb_lightning.lit.model.module import CausalLMModule

MICRO_BATCHES = len(SAMPLES[0])
LORA = {"r": 4, "alpha": 8.0}


class ShardRecordingModule(CausalLMModule):
    """A float64 tiny causal LM on SGD(lr=1) that records, whole, what each optimizer
    step used, and how its parameters were laid out while it trained."""

    def __init__(self, finetuning: str = "full") -> None:
        super().__init__(**tiny_arguments(loss_chunk_tokens=4, finetuning=finetuning, lora=LORA))
        self.steps: list[dict[str, Tensor]] = []
        self.final_params: Tensor | None = None
        self.layout: dict[str, Any] = {}

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        # Lightning unwraps (DDP) at teardown: look while it trains.
        named = dict(self.named_parameters())
        self.layout = {
            "ddp": isinstance(
                self.trainer.strategy.model, torch.nn.parallel.DistributedDataParallel
            ),
            "all_dtensor": all(isinstance(p, DTensor) for p in named.values()),
            "full_numel": sum(p.numel() for p in named.values()),
            "local_numel": sum(
                (p.to_local() if isinstance(p, DTensor) else p).numel() for p in named.values()
            ),
            "trainable": sorted(n for n, p in named.items() if p.requires_grad),
            "frozen": sorted(n for n, p in named.items() if not p.requires_grad),
        }

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        params = gathered_params(self)
        super().on_before_optimizer_step(optimizer)  # the mixin's 1/N scale happens here
        trainable = [p for p in self.parameters() if p.requires_grad]
        self.steps.append(
            {
                "params": params,
                "grad": gathered_trainable_grad(self),
                "grads_sharded": all(isinstance(p.grad, DTensor) for p in trainable),
            }
        )

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self.final_params = gathered_params(self)

    @override
    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=1.0)

    @override
    def train_dataloader(self) -> DataLoader:
        # Called on each rank after the process group is up: global_rank is known.
        return DataLoader(rank_batches(self.global_rank), batch_size=None, collate_fn=hand_over)


# Each launch: (module, finetuning, accumulate_grad_batches) fitted in this order.
LAUNCHES: dict[str, list[tuple[type[ShardRecordingModule], str, int]]] = {
    "ddp": [(ShardRecordingModule, "lora", 2)],
    "fsdp2": [(ShardRecordingModule, "full", 2), (ShardRecordingModule, "lora", 2)],
}


def variant_name(module_class: type[ShardRecordingModule], finetuning: str) -> str:
    return f"{module_class.__name__}_{finetuning}"


def launch_strategy(launch: str) -> Strategy:
    if launch == "fsdp2":
        return FSDP2Strategy(process_group_backend="gloo")
    return DDPStrategy(process_group_backend="gloo")


def fit_on_both_ranks(
    launch: str,
    module_class: type[ShardRecordingModule],
    finetuning: str,
    accumulate: int,
    out_dir: Path,
) -> None:
    """One rank's part of the 2-process job; writes ``{launch}_{variant}_rank{r}.pt``."""
    # The same initial weights on both ranks (DDP broadcasts rank 0's anyway; under FSDP2
    # each rank fills its own shard). The reference reads them from the records.
    torch.manual_seed(0)
    module = module_class(finetuning)
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=launch_strategy(launch),
        accumulate_grad_batches=accumulate,
        max_steps=MICRO_BATCHES // accumulate,
        gradient_clip_val=None,
        use_distributed_sampler=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module)
    torch.save(
        {
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "layout": module.layout,
            "steps": module.steps,
            "final_params": module.final_params,
            "train_loss": trainer.callback_metrics.get("train/loss"),
        },
        out_dir / f"{launch}_{variant_name(module_class, finetuning)}_rank{trainer.global_rank}.pt",
    )


# -- the tests (pytest process) -----------------------------------------------------------


def step_gradient(
    finetuning: str, params: Tensor, step: int, accumulate: int
) -> tuple[Tensor, float]:
    """Gradient (of the trainable parameters) and value of the global per-token mean loss
    of optimizer step ``step``: every real sample of both ranks' micro-batches of that
    step, one process, one batch, full logits from the Hugging Face forward."""
    micro_batches = range(step * accumulate, (step + 1) * accumulate)
    union = [
        make_sample(*spec)
        for rank in range(WORLD_SIZE)
        for k in micro_batches
        if (rank, k) not in IDLE
        for spec in SAMPLES[rank][k]
    ]
    return union_gradient(ShardRecordingModule(finetuning), union, params, trainable_only=True)


def launch_records(launch: str, out_dir: Path) -> dict[str, list[dict]]:
    """The records of one launch's modules in the session's job, by variant and rank."""
    return {
        variant_name(cls, finetuning): [
            torch.load(
                out_dir / f"{launch}_{variant_name(cls, finetuning)}_rank{r}.pt",
                weights_only=False,
            )
            for r in range(WORLD_SIZE)
        ]
        for cls, finetuning, _ in LAUNCHES[launch]
    }


@pytest.fixture(scope="module")
def ddp_records(exact_loss_records: Path) -> dict[str, list[dict]]:
    return launch_records("ddp", exact_loss_records)


@pytest.fixture(scope="module")
def fsdp2_records(exact_loss_records: Path) -> dict[str, list[dict]]:
    return launch_records("fsdp2", exact_loss_records)


def trainable_mask(finetuning: str) -> Tensor:
    """Which entries of the flat parameters (``parameters()`` order) train."""
    reference = ShardRecordingModule(finetuning)
    reference.configure_model()
    return torch.cat(
        [
            torch.full((p.numel(),), p.requires_grad, dtype=torch.bool)
            for p in reference.parameters()
        ]
    )


def check_union_gradients(ranks: list[dict], finetuning: str, accumulate: int) -> list[float]:
    """Every step of a 2-rank record has the union-batch gradient, as captured and as
    applied; returns the relative errors of the captured gradients, step by step."""
    steps = MICRO_BATCHES // accumulate
    assert [r["world_size"] for r in ranks] == [WORLD_SIZE, WORLD_SIZE]
    assert [r["global_step"] for r in ranks] == [steps, steps]
    assert [len(r["steps"]) for r in ranks] == [steps, steps]
    mask = trainable_mask(finetuning)
    rank0, rank1 = ranks
    errors = []
    for step in range(steps):
        params, grad = rank0["steps"][step]["params"], rank0["steps"][step]["grad"]
        # Both ranks see the same whole weights and gradient (broadcast and all-reduce
        # under DDP, all-gathers of the reduce-scattered shards under FSDP2).
        assert torch.equal(params, rank1["steps"][step]["params"])
        assert torch.equal(grad, rank1["steps"][step]["grad"])
        after = rank0["steps"][step + 1]["params"] if step + 1 < steps else rank0["final_params"]
        update = params - after
        assert torch.equal(update[~mask], torch.zeros_like(update[~mask]))  # frozen stay put
        # SGD(lr=1) applied exactly the captured gradient: nothing changed it afterwards.
        assert rel_err(update[mask], grad) <= 1e-10
        expected, expected_loss = step_gradient(finetuning, params, step, accumulate)
        errors.append(rel_err(grad, expected))
        assert errors[-1] <= 1e-5
        assert rel_err(update[mask], expected) <= 1e-5
    # The logged train/loss of the last step is the union's per-token mean (sync_dist
    # averages the ranks' shares W * local_sum / N).
    assert float(rank0["train_loss"]) == pytest.approx(expected_loss, rel=1e-9)
    return errors


def check_lora_layout(layout: dict[str, Any]) -> None:
    """Only the LoRA adapters train; every one of them does, the base weights are frozen."""
    assert layout["trainable"] and layout["frozen"]
    assert all(".lora_A." in n or ".lora_B." in n for n in layout["trainable"])
    assert not any(".lora_" in n for n in layout["frozen"])
    assert any("embed_tokens" in n for n in layout["frozen"])


def check_sharded(ranks: list[dict]) -> None:
    """Every parameter is a ``DTensor`` and the ranks hold disjoint halves of them."""
    layouts = [r["layout"] for r in ranks]
    assert all(layout["all_dtensor"] and not layout["ddp"] for layout in layouts)
    full = layouts[0]["full_numel"]
    assert all(0 < layout["local_numel"] < full for layout in layouts)
    assert sum(layout["local_numel"] for layout in layouts) == full
    assert all(step["grads_sharded"] for r in ranks for step in r["steps"])


@pytest.mark.parametrize("finetuning", ["full", "lora"])
def test_fsdp2_gradient_equals_union_batch_gradient(
    fsdp2_records: dict[str, list[dict]], finetuning: str
) -> None:
    ranks = fsdp2_records[variant_name(ShardRecordingModule, finetuning)]
    check_sharded(ranks)
    if finetuning == "lora":
        check_lora_layout(ranks[0]["layout"])
    else:
        assert not ranks[0]["layout"]["frozen"]
    errors = check_union_gradients(ranks, finetuning, accumulate=2)
    print(f"fsdp2 {finetuning}: relative errors per step {errors}")


def test_lora_ddp_gradient_equals_union_batch_gradient(
    ddp_records: dict[str, list[dict]],
) -> None:
    ranks = ddp_records[variant_name(ShardRecordingModule, "lora")]
    assert all(r["layout"]["ddp"] and not r["layout"]["all_dtensor"] for r in ranks)
    assert not any(step["grads_sharded"] for r in ranks for step in r["steps"])
    check_lora_layout(ranks[0]["layout"])
    errors = check_union_gradients(ranks, "lora", accumulate=2)
    print(f"ddp lora: relative errors per step {errors}")
