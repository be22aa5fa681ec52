"""Exact token-weighted loss under real DDP: 2 gloo processes, accumulation, an IDLE step.

SPEC 3.3: an N-rank dynamic run (with accumulation) produces the same gradient as one
process on the union batch (relative error <= 1e-5 in float64).

How it runs: ``exact_loss_job.py`` (the session's one exact-loss job) runs under ``python
-m torch.distributed.run --standalone --nproc_per_node 2`` (torchrun; both ranks start, and
import, at once: about 10 s less than Lightning's own launcher, which starts rank 1 only
once rank 0 has imported everything and is in ``fit``; that launcher is covered by the
2-rank ``train.py`` runs of ``test_train_faults.py`` and ``test_sharded_checkpoints.py``).
Each rank builds a ``pl.Trainer(devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
accumulate_grad_batches=2)``; Lightning takes the ranks from torchrun's environment, wraps
the model in ``DistributedDataParallel`` and gloo all-reduces its gradients.

How gradients are captured: the module trains with ``SGD(lr=1)`` and no clipping, and
snapshots its flat parameters and gradients in its own ``on_before_optimizer_step`` right
after the mixin's ``1 / N`` scale, and its parameters again after the last step. The
gradient of step k is checked twice: as captured, and as ``params_k - params_{k+1}`` (what
the optimizer really applied), so no hook ordering can fool the test. The reference is
the gradient of the global per-token mean loss over the union of both ranks' micro-batches
of that step, computed in the test process on a full-logits forward at the recorded
``params_k``.

The same two processes also fit a control module that returns the usual loss (each
micro-batch's own token mean, no ``1 / N`` scale): its gradient misses the reference by
far, which shows that the comparison can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import (
    flat_grad,
    flat_params,
    hand_over,
    make_sample,
    quiet_trainer,
    rel_err,
    step_batches,
    tiny_arguments,
    union_gradient,
)
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import ODBBatch

WORLD_SIZE = 2
ACCUMULATE = 2
OPTIMIZER_STEPS = 2

# SAMPLES[rank][micro_batch]: (length, unsupervised prompt tokens, seed) per sample. Local
# batch sizes differ between the ranks at every position; micro-batch 1 of rank 1 is IDLE
# and carries a batch with supervised labels all the same, which must count for nothing.
SAMPLES = [
    [
        [(9, 3, 1), (6, 2, 2)],
        [(11, 4, 3)],
        [(7, 2, 6)],
        [(12, 5, 7), (8, 1, 8), (5, 2, 9)],
    ],
    [
        [(5, 1, 4)],
        [(8, 2, 99)],
        [(10, 3, 10), (9, 4, 11)],
        [(6, 1, 12)],
    ],
]
IDLE = {(1, 1)}


def rank_batches(rank: int) -> list[ODBBatch]:
    """Rank ``rank``'s micro-batches with the metadata the ODB runtime would give them:
    ``global_loss_tokens`` is the true count over both ranks at each step position."""
    samples = [[[make_sample(*s) for s in micro] for micro in micros] for micros in SAMPLES]
    return step_batches(samples, IDLE)[rank]


class RecordingModule(CausalLMModule):
    """A float64 tiny causal LM on SGD(lr=1) that records what each optimizer step used."""

    def __init__(self) -> None:
        super().__init__(**tiny_arguments(loss_chunk_tokens=4))
        self.steps: list[dict[str, Tensor]] = []
        self.final_params: Tensor | None = None
        self.wrapped_in_ddp = False

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        # Lightning unwraps the model again at teardown: look while it trains.
        self.wrapped_in_ddp = isinstance(
            self.trainer.strategy.model, torch.nn.parallel.DistributedDataParallel
        )

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        params = flat_params(self)
        super().on_before_optimizer_step(optimizer)  # the mixin's 1/N scale happens here
        self.steps.append({"params": params, "grad": flat_grad(self)})

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self.final_params = flat_params(self)

    @override
    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)

    @override
    def train_dataloader(self) -> DataLoader:
        # Called on each rank after the process group is up: global_rank is known.
        return DataLoader(rank_batches(self.global_rank), batch_size=None, collate_fn=hand_over)


class PerRankMeanModule(RecordingModule):
    """Control: the usual loss, each micro-batch's own token mean, and no 1/N scale."""

    @override
    def training_step(self, batch: ODBBatch, batch_idx: int) -> Tensor:
        loss_sum, num_loss_tokens = self(batch.inputs)
        return loss_sum * 0.0 if batch.meta.is_idle else loss_sum / num_loss_tokens

    @override
    def scale_accumulated_gradients(self) -> Tensor | None:
        return None


def fit_on_both_ranks(module_class: type[RecordingModule], out_dir: Path) -> None:
    """One rank's part of the 2-process job; writes ``{class}_rank{r}.pt``."""
    torch.manual_seed(0)  # the same initial weights on both ranks
    module = module_class()
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=DDPStrategy(process_group_backend="gloo"),
        accumulate_grad_batches=ACCUMULATE,
        max_steps=OPTIMIZER_STEPS,
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
            "is_ddp": module.wrapped_in_ddp,
            "steps": module.steps,
            "final_params": module.final_params,
            "train_loss": trainer.callback_metrics.get("train/loss"),
        },
        out_dir / f"{module_class.__name__}_rank{trainer.global_rank}.pt",
    )


# -- the test (pytest process) ------------------------------------------------------------


def step_gradient(params: Tensor, step: int) -> tuple[Tensor, float]:
    """Gradient and value of the global per-token mean loss of optimizer step ``step``:
    every real sample of both ranks' micro-batches of that step, one process, one batch,
    full logits from the Hugging Face forward."""
    micro_batches = range(step * ACCUMULATE, (step + 1) * ACCUMULATE)
    union = [
        make_sample(*spec)
        for rank in range(WORLD_SIZE)
        for k in micro_batches
        if (rank, k) not in IDLE
        for spec in SAMPLES[rank][k]
    ]
    return union_gradient(RecordingModule(), union, params)


@pytest.fixture(scope="module")
def ddp_records(exact_loss_records: Path) -> dict[str, list[dict]]:
    """The records of both modules from the session's 2-rank job, by rank."""
    return {
        cls.__name__: [
            torch.load(exact_loss_records / f"{cls.__name__}_rank{r}.pt", weights_only=False)
            for r in range(WORLD_SIZE)
        ]
        for cls in (RecordingModule, PerRankMeanModule)
    }


def test_two_rank_ddp_gradient_equals_union_batch_gradient(
    ddp_records: dict[str, list[dict]],
) -> None:
    ranks = ddp_records["RecordingModule"]
    assert [r["world_size"] for r in ranks] == [WORLD_SIZE, WORLD_SIZE]
    assert all(r["is_ddp"] for r in ranks)  # gradients were all-reduced by DDP itself
    assert [r["global_step"] for r in ranks] == [OPTIMIZER_STEPS, OPTIMIZER_STEPS]
    assert [len(r["steps"]) for r in ranks] == [OPTIMIZER_STEPS, OPTIMIZER_STEPS]
    rank0, rank1 = ranks
    for step in range(OPTIMIZER_STEPS):
        params = rank0["steps"][step]["params"]
        grad0, grad1 = rank0["steps"][step]["grad"], rank1["steps"][step]["grad"]
        # Same weights and the same gradient on both ranks (DDP broadcast + all-reduce).
        assert torch.equal(params, rank1["steps"][step]["params"])
        assert torch.equal(grad0, grad1)
        # SGD(lr=1) applied exactly the captured gradient: nothing changed it afterwards.
        after = (
            rank0["steps"][step + 1]["params"]
            if step + 1 < OPTIMIZER_STEPS
            else rank0["final_params"]
        )
        assert rel_err(params - after, grad0) <= 1e-10
        expected, expected_loss = step_gradient(params, step)
        assert rel_err(grad0, expected) <= 1e-5
        assert rel_err(params - after, expected) <= 1e-5
    # The logged train/loss of the last step is the union's per-token mean (sync_dist
    # averages the ranks' shares W * local_sum / N).
    assert float(rank0["train_loss"]) == pytest.approx(expected_loss, rel=1e-9)


def test_control_per_rank_mean_loss_misses_the_union_gradient(
    ddp_records: dict[str, list[dict]],
) -> None:
    rank0, rank1 = ddp_records["PerRankMeanModule"]
    for step in range(OPTIMIZER_STEPS):
        grad = rank0["steps"][step]["grad"]
        assert torch.equal(grad, rank1["steps"][step]["grad"])  # DDP still agrees
        expected, _ = step_gradient(rank0["steps"][step]["params"], step)
        assert rel_err(grad, expected) > 1e-2
