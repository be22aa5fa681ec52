"""The exact token-weighted loss under Lightning's FSDP (FSDP1) and DeepSpeed, on one GPU.

Neither strategy runs on CPU, so these tests are skipped without CUDA. They cover the two
places where :class:`~odb_lightning.lit.model.loss.TokenWeightedLossMixin` adapts to a
strategy:

- FSDP1: gradients are in ``param.grad`` (``use_orig_params``), so ``1 / N`` scales them
  as under DDP; norm clipping goes through the wrapped root's ``clip_grad_norm_`` (the
  mixin's ``configure_gradient_clipping``), which Lightning's FSDP precision plugin
  refuses to do itself.
- DeepSpeed ZeRO-2: gradients live in DeepSpeed's buffers (``param.grad`` stays
  ``None``), so the mixin chooses :attr:`GradientScaling.LOSS` and scales each loss by
  ``W / N`` before backward.

Each fit takes two ``SGD(lr=1)`` steps over rank 0's micro-batches of
``test_exact_loss_ddp.py``; the update the optimizer applied is compared with the
gradient of the per-token mean over the step's micro-batches, computed in float64 on the
CPU at the recorded parameters.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy
from test_exact_loss_ddp import SAMPLES
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
from odb_lightning.lit.model.loss import GradientScaling
from odb_lightning.lit.model.module import CausalLMModule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MICRO_BATCHES = SAMPLES[0]  # rank 0's four micro-batches, of 2, 1, 1 and 3 samples
OPTIMIZER_STEPS = 2
CLIP_NORM = 1.0
# Both strategies compute in float32 (``32-true``: FSDP1 gathers float32 parameters, ZeRO
# keeps float32 partitions) against a float64 reference; a wrong ``N`` or ``W`` misses
# the reference by far more than this.
FLOAT32_REL = 1e-3
# An update read back as ``params_k - params_{k+1}`` in float32 carries the rounding of
# the parameters, which are larger than the (clipped) gradient.
UPDATE_REL = 1e-4


class GpuStepRecorder(CausalLMModule):
    """A tiny causal LM on SGD(lr=1) recording, on the host, the parameters each optimizer
    step starts from, the gradient it is handed (where ``param.grad`` holds one) and the
    gradient after clipping."""

    def __init__(self, model_dtype: str) -> None:
        super().__init__(**tiny_arguments(loss_chunk_tokens=4, model_dtype=model_dtype))
        self.params: list[Tensor] = []
        self.grads: list[Tensor] = []
        self.clipped: list[Tensor] = []
        self.final_params: Tensor | None = None

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        self.params.append(flat_params(self).cpu())
        super().on_before_optimizer_step(optimizer)  # the mixin's 1/N scale happens here
        if all(p.grad is not None for p in self.parameters()):
            self.grads.append(flat_grad(self).cpu())

    @override
    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if all(p.grad is not None for p in self.parameters()):
            self.clipped.append(flat_grad(self).cpu())

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self.final_params = flat_params(self).cpu()

    @override
    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


def expected_gradient(params: Tensor, step: int, accumulate: int) -> tuple[Tensor, float]:
    """The float64 gradient and value of the per-token mean over step ``step``'s
    micro-batches, at ``params`` (cast to float64), on the CPU."""
    samples = [
        make_sample(*spec)
        for micro in MICRO_BATCHES[step * accumulate : (step + 1) * accumulate]
        for spec in micro
    ]
    reference = CausalLMModule(**tiny_arguments(loss_chunk_tokens=4))  # float64
    return union_gradient(reference, samples, params.to(torch.float64))


def fit_on_gpu(module: GpuStepRecorder, accumulate: int, **trainer_kwargs: Any) -> pl.Trainer:
    """Two optimizer steps of ``module`` on one GPU over rank 0's micro-batches."""
    samples = [[make_sample(*spec) for spec in micro] for micro in MICRO_BATCHES]
    batches = step_batches([samples[: OPTIMIZER_STEPS * accumulate]])[0]
    trainer = quiet_trainer(
        accelerator="cuda",
        devices=1,
        accumulate_grad_batches=accumulate,
        max_steps=OPTIMIZER_STEPS,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        **trainer_kwargs,
    )
    loader = DataLoader(batches, batch_size=None, collate_fn=hand_over)
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == OPTIMIZER_STEPS
    assert module.final_params is not None and len(module.params) == OPTIMIZER_STEPS
    return trainer


def applied_updates(module: GpuStepRecorder) -> list[Tensor]:
    """``params_k - params_{k+1}`` of every step: what ``SGD(lr=1)`` applied."""
    after = [*module.params[1:], module.final_params]
    return [before - later for before, later in zip(module.params, after, strict=True)]


def test_fsdp1_scales_gradients_and_clips_by_the_global_norm() -> None:
    torch.manual_seed(0)
    module = GpuStepRecorder(model_dtype="float32")
    accumulate = 2
    trainer = fit_on_gpu(
        module,
        accumulate,
        strategy=FSDPStrategy(),
        gradient_clip_val=CLIP_NORM,
        gradient_clip_algorithm="norm",
    )
    assert module._scaling is GradientScaling.GRADIENTS
    assert len(module.grads) == len(module.clipped) == OPTIMIZER_STEPS
    updates = applied_updates(module)
    for step in range(OPTIMIZER_STEPS):
        expected, expected_loss = expected_gradient(module.params[step], step, accumulate)
        grad, clipped = module.grads[step], module.clipped[step]
        assert rel_err(grad, expected) <= FLOAT32_REL  # the union gradient, before clipping
        # Clipped by the norm over every parameter: scaled to CLIP_NORM, direction kept
        # (the tiny model's gradient norm is about 2 at these steps: clipping acts).
        norm = float(grad.norm())
        assert norm > CLIP_NORM
        assert float(clipped.norm()) == pytest.approx(CLIP_NORM, rel=1e-4)
        assert rel_err(clipped * (norm / float(clipped.norm())), grad) <= 1e-5
        assert rel_err(updates[step], clipped) <= UPDATE_REL  # the optimizer applied it
    loss = float(trainer.callback_metrics["train/loss"])
    assert math.isfinite(loss) and loss == pytest.approx(expected_loss, rel=FLOAT32_REL)


def test_deepspeed_stage2_takes_the_loss_scaling_path() -> None:
    pytest.importorskip("deepspeed")
    torch.manual_seed(0)
    module = GpuStepRecorder(model_dtype="float32")
    trainer = fit_on_gpu(module, accumulate=1, strategy=DeepSpeedStrategy(stage=2))
    assert module._scaling is GradientScaling.LOSS
    updates = applied_updates(module)
    for step in range(OPTIMIZER_STEPS):
        expected, expected_loss = expected_gradient(module.params[step], step, accumulate=1)
        # Each loss was scaled by W / N before backward: the update is the union gradient.
        assert rel_err(updates[step], expected) <= FLOAT32_REL
    loss = float(trainer.callback_metrics["train/loss"])
    assert math.isfinite(loss) and loss == pytest.approx(expected_loss, rel=FLOAT32_REL)
