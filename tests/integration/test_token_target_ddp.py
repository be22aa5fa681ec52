"""Token-target steps under DDP: two gloo ranks running a real Lightning ``Trainer``.

Each rank is its own process (forked from a forkserver with torch, Lightning and this
module preloaded) and joins the default group from the environment as if ``torchrun``
had started it (``LOCAL_RANK`` set: Lightning launches nothing), with
``DDPStrategy(process_group_backend="gloo")``. The ranks get different micro-batches but
the same ``global_loss_tokens`` metadata; a DDP communication hook records which
micro-batches all-reduce gradients (Lightning itself registers such hooks on CUDA only).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import (
    flat_grad,
    flat_params,
    hand_over,
    make_sample,
    quiet_trainer,
    step_batches,
    tiny_module,
    union_gradient,
)
from odb_lightning.core.loss_weights import token_target_boundaries
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import ODBBatch
from testing.harness.processes import kill_alive

VOCAB = 128
WORLD_SIZE = 2
TOKENS_PER_STEP = 30
# Per rank, per micro-batch: sample lengths (prompt = length // 3); None is IDLE.
RANK_LENGTHS: list[list[list[int] | None]] = [
    [[12, 7], [9], [20, 15], [6], [11], [8, 5]],
    [[5], [14, 10], [18], [7, 7], None, [9]],
]


def rank_samples(rank: int, step: int) -> list[tuple[Tensor, Tensor]]:
    lengths = RANK_LENGTHS[rank][step] or []
    return [
        make_sample(length, length // 3, seed=1000 * rank + 10 * step + position, vocab=VOCAB)
        for position, length in enumerate(lengths)
    ]


def all_rank_batches() -> list[list[ODBBatch]]:
    """Every rank's micro-batches; ``global_loss_tokens`` is the step position's total, as
    the alignment exchange tells every rank."""
    return step_batches(
        [
            [
                None if lengths is None else rank_samples(rank, step)
                for step, lengths in enumerate(steps)
            ]
            for rank, steps in enumerate(RANK_LENGTHS)
        ]
    )


def small_module(module_class: type[CausalLMModule] = CausalLMModule) -> CausalLMModule:
    return tiny_module(
        module_class,
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        lr=1e-2,
        scheduler="constant",
        tokens_per_step=TOKENS_PER_STEP,
    )


class AllReduceLog:
    """DDP communication-hook state: the micro-batch during which each bucket was reduced."""

    def __init__(self) -> None:
        self.batch_index = -1
        self.reduced_at: list[int] = []


def logging_allreduce_hook(state: AllReduceLog, bucket):  # type: ignore[no-untyped-def]
    # No annotations: DDP checks them as objects, and ``from __future__`` makes them strings.
    state.reduced_at.append(state.batch_index)
    return allreduce_hook(None, bucket)  # DDP's default: mean over the world group


class StepRecorder(CausalLMModule):
    """Records the closing micro-batch, parameters and gradient of every optimizer step."""

    all_reduce_log: AllReduceLog

    @override
    def on_fit_start(self) -> None:
        super().on_fit_start()
        # Lightning registers DDP communication hooks on CUDA only: do it here, on the
        # DistributedDataParallel wrapper the strategy built.
        ddp = self.trainer.strategy.model
        assert isinstance(ddp, DistributedDataParallel)
        ddp.register_comm_hook(self.all_reduce_log, logging_allreduce_hook)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        self.all_reduce_log.batch_index = batch_idx
        return super().on_train_batch_start(batch, batch_idx)

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)  # scales the gradients by 1 / N
        params, grad = flat_params(self), flat_grad(self)
        self.steps.append((self.all_reduce_log.batch_index, params.numpy(), grad.numpy()))


def train_rank(rank: int) -> dict[str, Any]:
    """One rank's fit; what it reports (numpy arrays pickle by value)."""
    torch.set_num_threads(1)  # two ranks on two cores
    log = AllReduceLog()
    module = small_module(StepRecorder)
    module.all_reduce_log, module.steps = log, []
    strategy = DDPStrategy(process_group_backend="gloo")
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=strategy,
        max_epochs=1,
        gradient_clip_val=1.0,
        use_distributed_sampler=False,  # each rank has its own micro-batches
        limit_val_batches=0,
    )
    loader = DataLoader(all_rank_batches()[rank], batch_size=None, collate_fn=hand_over)
    trainer.fit(module, train_dataloaders=loader)
    return {
        "steps": [(index, params.copy(), grad.copy()) for index, params, grad in module.steps],
        "reduced_at": log.reduced_at,
        "global_step": trainer.global_step,
        "final": flat_params(module).numpy(),
    }


def rank_main(rank: int, store_port: int, results: Any) -> None:
    """A rank as ``torchrun`` would start it; the test process hosts the store."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store_port),
        WORLD_SIZE=str(WORLD_SIZE),
        NODE_RANK="0",
        LOCAL_RANK=str(rank),
        TORCHELASTIC_USE_AGENT_STORE="True",  # connect to the test's store, host none
    )
    try:
        results.put(("ok", rank, train_rank(rank)))
    except Exception as error:  # reported to the test, which fails on it
        results.put(("error", rank, f"{type(error).__name__}: {error}"))


def run_ranks(timeout_s: float) -> dict[int, dict[str, Any]]:
    """Every rank's report; every rank is joined or killed before return."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "lightning.pytorch", "test_token_target_ddp"])
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    results = context.Queue()
    ranks = [
        context.Process(target=rank_main, args=(rank, store.port, results))
        for rank in range(WORLD_SIZE)
    ]
    for process in ranks:
        process.start()
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < WORLD_SIZE:
            try:
                kind, rank, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"ranks did not finish within {timeout_s}s") from None
            assert kind == "ok", f"rank {rank} failed: {payload}"
            reports[rank] = payload
        for process in ranks:
            process.join(max(0.1, deadline - time.monotonic()))
    finally:
        kill_alive(ranks)
    return reports


@pytest.mark.slow  # 10-22 s on two cores, most of it the forkserver importing Lightning
def test_two_ranks_step_together_and_reduce_once_per_optimizer_step() -> None:
    global_counts = [batch.meta.global_loss_tokens for batch in all_rank_batches()[0]]
    boundaries = token_target_boundaries(global_counts, TOKENS_PER_STEP)
    assert len(boundaries) >= 3 and boundaries != list(range(len(boundaries)))  # accumulates
    reports = run_ranks(timeout_s=90)

    for report in reports.values():
        assert [index for index, _, _ in report["steps"]] == boundaries
        assert report["global_step"] == len(boundaries)
        # Gradients travel only with the closing micro-batch's backward (no_sync elsewhere).
        assert sorted(set(report["reduced_at"])) == boundaries
    np.testing.assert_array_equal(reports[0]["final"], reports[1]["final"])
    assert not np.array_equal(reports[0]["final"], reports[0]["steps"][0][1])  # it trained

    starts = [0] + [b + 1 for b in boundaries[:-1]]
    for k, (start, end) in enumerate(zip(starts, boundaries, strict=True)):
        _, params, grad = reports[0]["steps"][k]
        np.testing.assert_array_equal(params, reports[1]["steps"][k][1])
        np.testing.assert_array_equal(grad, reports[1]["steps"][k][2])
        window = [
            sample
            for rank in range(WORLD_SIZE)
            for step in range(start, end + 1)
            for sample in rank_samples(rank, step)
        ]
        expected, _ = union_gradient(small_module(), window, torch.from_numpy(params))
        error = (torch.from_numpy(grad) - expected).norm() / expected.norm()
        assert float(error) <= 1e-5
