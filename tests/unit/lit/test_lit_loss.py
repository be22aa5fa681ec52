"""The token-weighted loss mixin gives the gradient of one process on the union batch.

The algebra is checked in pure Python in ``test_loss_weights.py``; here real gradients of a
float64 model go through the mixin, a simulated DDP average and Lightning's accumulation, and
through a real ``pl.Trainer``.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import (
    fit_on_cpu,
    flat_grad,
    full_loss_sum,
    hand_over,
    loss_tokens,
    make_sample,
    pad,
    quiet_trainer,
    rel_err,
    step_batches,
    tiny_module,
    union_gradient,
)
from odb_lightning.lit.model.fsdp2 import FSDP2Strategy
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import ODBBatch, StepMeta, idle_sample, pad_collate

ARGUMENTS = {"loss_chunk_tokens": 5, "lr": 1e-3}


# Two ranks, two accumulated micro-batches each, uneven sizes; rank 1's second micro-batch
# is IDLE and carries a dummy batch with supervised labels, which must count for nothing.
RANK_SAMPLES = [
    [[(9, 3, 1), (6, 2, 2)], [(11, 4, 3)]],
    [[(5, 1, 4)], [(4, 1, 5)]],
]
IDLE = {(1, 1)}


def simulated_rank_batches() -> list[list[ODBBatch]]:
    samples = [
        [[make_sample(*spec) for spec in micro] for micro in micros] for micros in RANK_SAMPLES
    ]
    return step_batches(samples, IDLE)


def real_samples() -> list[tuple[Tensor, Tensor]]:
    """Every sample of the non-IDLE micro-batches: the union batch."""
    return [
        make_sample(*spec)
        for rank, micros in enumerate(RANK_SAMPLES)
        for step, micro in enumerate(micros)
        if (rank, step) not in IDLE
        for spec in micro
    ]


def test_two_rank_accumulated_gradient_equals_union_batch_gradient() -> None:
    world, accumulate = 2, 2
    base = tiny_module(**ARGUMENTS)
    replicas = [copy.deepcopy(base) for _ in range(world)]
    for replica, batches in zip(replicas, simulated_rank_batches(), strict=True):
        replica.trainer = SimpleNamespace(world_size=world, accumulate_grad_batches=accumulate)
        for step, batch in enumerate(batches):
            # Lightning's automatic optimization divides the returned loss.
            (replica.training_step(batch, step) / accumulate).backward()
    # DDP: every rank ends up with the average of the ranks' accumulated gradients.
    for parameters in zip(*(r.parameters() for r in replicas), strict=True):
        mean = sum(p.grad for p in parameters) / world
        for p in parameters:
            p.grad = mean.clone()
    logged = [replica.scale_accumulated_gradients() for replica in replicas]

    real = real_samples()
    expected_grad, expected_loss = union_gradient(base, real)
    assert rel_err(flat_grad(replicas[0]), expected_grad) <= 1e-5
    assert rel_err(flat_grad(replicas[1]), expected_grad) <= 1e-5
    # sync_dist averages the ranks' logged values: that is the global token mean.
    assert float(sum(logged) / world) == pytest.approx(expected_loss, rel=1e-10)


def test_a_per_rank_mean_would_not_match() -> None:
    """Control: the classic mean-per-rank loss misses the union gradient on these batches."""
    base = tiny_module(**ARGUMENTS)
    rank_batches = simulated_rank_batches()
    replicas = [copy.deepcopy(base) for _ in range(2)]
    for replica, batches in zip(replicas, rank_batches, strict=True):
        for batch in batches:
            if not batch.meta.is_idle:
                (
                    full_loss_sum(replica.model, batch.inputs) / loss_tokens(batch.inputs) / 2
                ).backward()
    averaged = (flat_grad(replicas[0]) + flat_grad(replicas[1])) / 2
    real = real_samples()
    expected_grad, _ = union_gradient(base, real)
    assert rel_err(averaged, expected_grad) > 1e-2


def test_idle_step_gives_exactly_zero_gradients_for_every_parameter() -> None:
    module = tiny_module(**ARGUMENTS, tie_word_embeddings=False)
    module.trainer = SimpleNamespace(world_size=2, accumulate_grad_batches=1)
    # The runtime's one-token IDLE dummy has no supervised token; the untied head must
    # still take part in backward (DDP expects a gradient for every parameter).
    dummy = pad_collate([idle_sample(pad_id=0)])
    meta = StepMeta((), True, 0, 0, 0, 0, 0, 10, 0, 0, 0)
    module.training_step(ODBBatch(dummy, meta), 0).backward()
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None for g in grads)
    assert sum(int(g.count_nonzero()) for g in grads) == 0
    # N still counts the other ranks' tokens at this step position.
    assert module._pending_loss_tokens == [10]


def test_metadata_disagreeing_with_labels_raises() -> None:
    module = tiny_module(**ARGUMENTS)
    module.trainer = SimpleNamespace(world_size=1, accumulate_grad_batches=1)
    batch = pad([make_sample(6, 2, 8)])
    wrong = StepMeta((), False, 1, 6, 6, loss_tokens(batch) + 1, 1, 9, 0, 3, 0)
    # The forward gathers rows by the metadata's count (no host sync) and the count is
    # checked once per optimizer step: the step's check names the disagreement.
    module.training_step(ODBBatch(batch, wrong), 0)
    with pytest.raises(ValueError, match="differs from their step metadata"):
        module.check_loss_token_counts()


class GradientCapture(CausalLMModule):
    """Records the gradients the optimizer is about to use (after the 1/N scale)."""

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        self.captured = flat_grad(self).clone()


@pytest.mark.parametrize("batch_kind", ["dict", "odb_with_idle"])
def test_trainer_with_accumulation_sees_the_union_gradient(batch_kind: str) -> None:
    first = [make_sample(9, 3, 1), make_sample(6, 2, 2)]
    second = [make_sample(11, 4, 3)]
    if batch_kind == "dict":
        batches: list[object] = [pad(first), pad(second)]
        real = first + second
    else:
        n = loss_tokens(pad(first))
        batches = [
            ODBBatch(pad(first), StepMeta((0, 1), False, 2, 15, 18, n, 2, n, 0, 0, 0)),
            ODBBatch(pad(second), StepMeta((), True, 0, 0, 0, 0, 0, 0, 0, 1, 0)),
        ]
        real = first
    module = tiny_module(GradientCapture, loss_chunk_tokens=4)
    expected_grad, expected_loss = union_gradient(module, real)
    trainer = fit_on_cpu(module, batches, max_steps=1, accumulate_grad_batches=2)
    assert trainer.global_step == 1
    assert rel_err(module.captured, expected_grad) <= 1e-5
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(expected_loss, rel=1e-10)


class ClipCapture(CausalLMModule):
    """Records the gradient that gradient clipping is handed."""

    @override
    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        self.clipped = flat_grad(self).clone()
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


class CallbackCapture(pl.Callback):
    """Records the gradient a callback's ``on_before_optimizer_step`` sees."""

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        self.seen = flat_grad(pl_module).clone()


def test_clipping_sees_the_scaled_gradient_and_callbacks_the_unscaled_one() -> None:
    # Lightning runs callbacks' on_before_optimizer_step before the module's (where the
    # mixin scales by 1 / N) and clips after it: docs/design.md relies on that order.
    samples = [make_sample(9, 3, 1), make_sample(6, 2, 2)]
    module = tiny_module(ClipCapture, loss_chunk_tokens=4)
    expected_grad, _ = union_gradient(module, samples)
    callback = CallbackCapture()
    fit_on_cpu(module, [pad(samples)], max_steps=1, callbacks=[callback], gradient_clip_val=1e9)
    assert rel_err(module.clipped, expected_grad) <= 1e-5
    assert rel_err(callback.seen, expected_grad * loss_tokens(pad(samples))) <= 1e-5


def test_a_step_without_any_gradient_in_param_grad_raises() -> None:
    """Where every rank holds every gradient (here one device), missing gradients (a
    strategy that keeps them in its own buffers) fail the step instead of skipping 1/N."""

    class DropGradients(pl.Callback):
        def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            for parameter in pl_module.parameters():
                parameter.grad = None

    module = tiny_module(loss_chunk_tokens=4)
    batches = [pad([make_sample(7, 2, 1)])]
    trainer = quiet_trainer(max_steps=1, callbacks=[DropGradients()], gradient_clip_val=None)
    with pytest.raises(RuntimeError, match="no trainable parameter has a gradient in param.grad"):
        trainer.fit(module, DataLoader(batches, batch_size=None, collate_fn=hand_over))


def test_only_strategies_holding_every_gradient_in_param_grad_are_accepted() -> None:
    # FSDP1 and DeepSpeed leave param.grad None outside a shard or entirely: 1 / N would
    # scale nothing, so the mixin refuses them at fit start rather than train unscaled.
    module = tiny_module(loss_chunk_tokens=4)
    for strategy in (DDPStrategy(), SingleDeviceStrategy("cpu"), FSDP2Strategy()):
        module.trainer = SimpleNamespace(strategy=strategy)
        module.on_fit_start()
    module.trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(ValueError, match="FSDPStrategy does not hold on every rank"):
        module.on_fit_start()
