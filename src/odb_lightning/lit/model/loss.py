"""Exact token-weighted loss for a LightningModule under DDP and gradient accumulation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from odb_lightning.core.checks import check_positive_int
from odb_lightning.core.loss_weights import gradient_scale
from odb_lightning.lit.model.idle_steps import zero_weight
from odb_lightning.lit.model.token_target import (
    HOLD_ACCUMULATE_GRAD_BATCHES,
    check_token_target_trainer,
    global_loss_tokens_of,
    sum_over_ranks,
)
from odb_lightning.runtime.batch import StepMeta

# Strategies that give every rank a gradient of every trainable parameter in param.grad
# (FSDP2 through ModelParallelStrategy: a DTensor, possibly of an empty shard).
GRADIENTS_ON_EVERY_RANK = (DDPStrategy, SingleDeviceStrategy, ModelParallelStrategy)


def check_gradient_strategy(strategy: object) -> None:
    """The ``1 / N`` scale multiplies ``param.grad``, which these strategies fill on every
    rank; FSDP1 and DeepSpeed (refused by the app) keep gradients elsewhere.

    Raises:
        ValueError: Any other strategy.
    """
    if not isinstance(strategy, GRADIENTS_ON_EVERY_RANK):
        raise ValueError(
            f"TokenWeightedLossMixin scales the gradients in param.grad, which "
            f"{type(strategy).__name__} does not hold on every rank: train with DDP, one "
            "device or FSDP2 (trainer=gpu8, trainer=gpu8_fsdp)"
        )


class TokenWeightedLossMixin(pl.LightningModule):
    """Makes an optimizer step descend the mean loss over every supervised token it saw.

    ``training_step`` returns :meth:`token_weighted_loss` of its summed token loss, which
    backpropagates ``W * sum_t l``; :meth:`on_before_optimizer_step` then multiplies every
    gradient by ``1 / N``, ``N`` being the global supervised-token count of the
    micro-batches since the last optimizer step (the algebra:
    :mod:`odb_lightning.core.loss_weights`; where ``N`` comes from, IDLE steps and the
    hooks used: ``docs/design.md``, "How the loss rides on Lightning's hooks"). Logged per
    optimizer step: ``train/loss`` (the global token-weighted mean) and ``lr``.

    Args:
        tokens_per_step: Step the optimizer once the global supervised tokens since the
            last step reach this (:mod:`odb_lightning.lit.model.token_target`; needs
            ``ODBBatch`` batches and ``trainer.accumulate_grad_batches=1``); ``None``
            steps every ``trainer.accumulate_grad_batches`` micro-batches.
    """

    weights_idle_steps = True  # see odb_lightning.lit.model.idle_steps

    def __init__(self, *args: object, tokens_per_step: int | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        check_positive_int("model.step.tokens_per_step", tokens_per_step, optional=True)
        self.tokens_per_step = tokens_per_step
        # Global supervised tokens of each micro-batch since the last optimizer step.
        self._pending_loss_tokens: list[int] = []
        # Local supervised tokens of micro-batches whose global count is not in their
        # metadata (plain batches, planned modes): summed over ranks once per step.
        self._pending_local_tokens: int | None = None
        # This rank's summed token loss (detached) over the same micro-batches.
        self._pending_loss_sum: Tensor | None = None

    def token_weighted_loss(
        self, loss_sum: Tensor, num_loss_tokens: int, meta: StepMeta | None = None
    ) -> Tensor:
        """The loss ``training_step`` returns for one micro-batch.

        Args:
            loss_sum: Sum (reduction ``"sum"``) of this micro-batch's token losses.
            num_loss_tokens: Supervised tokens in ``loss_sum`` on this rank.
            meta: The step metadata of an ODB batch, or ``None`` for a plain batch.

        Returns:
            ``loss_sum * W * accumulate_grad_batches``, or ``loss_sum * 0`` when IDLE.

        Raises:
            ValueError: If ``meta.local_loss_tokens`` disagrees with ``num_loss_tokens``
                (the global count would then be wrong too).
        """
        idle = meta is not None and meta.is_idle
        # An IDLE rank adds no token, but the step's global count (other ranks' tokens at
        # this step position) still belongs to N: every rank must divide by the same N.
        self._count_tokens(0 if idle else num_loss_tokens, meta)
        # An IDLE micro-batch adds a zero of the loss's dtype: a rank whose whole step is
        # IDLE still all-reduces its logged share in the dtype of the other ranks' shares.
        detached = torch.zeros_like(loss_sum.detach()) if idle else loss_sum.detach()
        pending = self._pending_loss_sum
        self._pending_loss_sum = detached if pending is None else pending + detached
        if idle:
            return zero_weight(loss_sum)
        # W undoes DDP's average over ranks (core algebra); accumulate_grad_batches undoes
        # Lightning's division of the returned loss. 1 / N follows in the gradient hook.
        return loss_sum * (self.trainer.world_size * self.trainer.accumulate_grad_batches)

    def scale_accumulated_gradients(self) -> Tensor | None:
        """Multiply every gradient by ``1 / N`` and start a new optimizer step.

        Returns:
            This rank's share of the step's mean loss, ``W * (summed loss) / N``; its mean
            over ranks is the global token-weighted mean loss. ``None`` when ``N`` is 0
            (no supervised token anywhere: there is no loss to report).
        """
        total_tokens = sum(self._pending_loss_tokens) + self._reduce_local_tokens()
        scale = gradient_scale([total_tokens])
        self._scale_gradients(scale, total_tokens)
        pending = self._pending_loss_sum
        local_sum = torch.zeros((), device=self.device) if pending is None else pending
        self._pending_loss_tokens = []
        self._pending_loss_sum = None
        return local_sum * (self.trainer.world_size * scale) if total_tokens else None

    def _scale_gradients(self, scale: float, total_tokens: int) -> None:
        trainable = [p for p in self.parameters() if p.requires_grad]
        grads = [p.grad for p in trainable if p.grad is not None]
        if trainable and not grads and total_tokens:
            # The same on every rank (GRADIENTS_ON_EVERY_RANK): no rank goes on alone.
            raise RuntimeError(
                f"no trainable parameter has a gradient in param.grad at the optimizer step "
                f"under {type(self.trainer.strategy).__name__}: the 1 / N scale of the exact "
                "token-weighted loss cannot be applied"
            )
        if grads:
            # One fused kernel launch per dtype and device, not one per parameter.
            torch._foreach_mul_(grads, scale)

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        # Token-target mode counts every micro-batch globally in _pending_loss_tokens.
        step_tokens = sum(self._pending_loss_tokens)
        step_loss = self.scale_accumulated_gradients()
        if step_loss is not None:  # the same on every rank: N is global
            self.log("train/loss", step_loss, on_step=True, sync_dist=True, prog_bar=True)
        self.log("lr", optimizer.param_groups[0]["lr"], on_step=True)
        if self.tokens_per_step is not None:
            self.log("train/tokens_per_optimizer_step", float(step_tokens), on_step=True)

    @override
    def on_fit_start(self) -> None:
        super().on_fit_start()
        check_gradient_strategy(self.trainer.strategy)
        if self.tokens_per_step is not None:
            check_token_target_trainer(self.trainer)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        response = super().on_train_batch_start(batch, batch_idx)
        if self.tokens_per_step is not None and response != -1:  # -1: the batch is skipped
            # Counted here, before the batch runs: Lightning reads the decision below
            # before it calls training_step. Every rank sees the same counts.
            self._pending_loss_tokens.append(
                global_loss_tokens_of(batch, self.trainer, self.device)
            )
            closes = sum(self._pending_loss_tokens) >= self.tokens_per_step
            self.trainer.accumulate_grad_batches = 1 if closes else HOLD_ACCUMULATE_GRAD_BATCHES
        return response

    @override
    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        # Token target: Lightning would zero before a closing micro-batch's backward and
        # drop the step's accumulated gradients; optimizer_step zeroes them after the step.
        if self.tokens_per_step is None:
            super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    @override
    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Optimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        if self.tokens_per_step is not None:
            optimizer.zero_grad()

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        if self.tokens_per_step is not None:
            self.trainer.accumulate_grad_batches = 1  # as configured (on_fit_start checked)

    def _count_tokens(self, num_loss_tokens: int, meta: StepMeta | None) -> None:
        """Add this micro-batch's ``n`` to ``N``: the global count from the metadata, or
        the local count, summed over ranks at the optimizer step."""
        if meta is not None and meta.local_loss_tokens != num_loss_tokens:
            raise ValueError(
                f"step metadata says {meta.local_loss_tokens} local loss tokens but the "
                f"labels have {num_loss_tokens} (shifted labels != -100) at step {meta.step}"
            )
        if self.tokens_per_step is not None:
            return  # counted over all ranks in on_train_batch_start
        if meta is not None and meta.global_loss_tokens is not None:
            self._pending_loss_tokens.append(int(meta.global_loss_tokens))
        else:
            self._pending_local_tokens = (self._pending_local_tokens or 0) + num_loss_tokens

    def _reduce_local_tokens(self) -> int:
        """Sum the locally counted tokens over ranks: one collective per optimizer step,
        taken on every rank alike (all ranks get the same kind of batches)."""
        local, self._pending_local_tokens = self._pending_local_tokens, None
        return 0 if local is None else sum_over_ranks(self.trainer, local, self.device)
