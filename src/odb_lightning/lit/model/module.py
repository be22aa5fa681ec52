"""Causal-LM LightningModule over Hugging Face ``transformers`` with a chunked LM head."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanMetric
from transformers import PreTrainedModel
from typing_extensions import override

from odb_lightning.core.nodes import plain
from odb_lightning.lit.model.attention_inputs import body_inputs
from odb_lightning.lit.model.config import Architecture, Finetuning, ModelRuntime, StepPolicy
from odb_lightning.lit.model.lm_head import chunked_lm_loss, loss_token_mismatch
from odb_lightning.lit.model.loss import TokenWeightedLossMixin
from odb_lightning.lit.model.lr_schedule import WarmupSchedule
from odb_lightning.lit.model.setup import build_model, compile_counts
from odb_lightning.lit.run_context import RunContext
from odb_lightning.runtime.batch import ODBBatch, StepMeta
from odb_lightning.sample import IGNORE_INDEX

OptimizerFactory = Callable[[list[dict[str, Any]]], Optimizer]
"""``model.optimizer``: a partial optimizer, called with the module's parameter groups."""
SchedulerFactory = Callable[[Optimizer], LRScheduler]
"""``model.scheduler``: a partial LR scheduler, called with the optimizer."""


def split_batch(batch: Any) -> tuple[Mapping[str, Tensor], StepMeta | None]:
    """Model inputs and step metadata of an ``ODBBatch``, or a plain dict and ``None``."""
    if isinstance(batch, Mapping):
        return batch, None
    if isinstance(batch, ODBBatch):
        return batch.inputs, batch.meta
    raise TypeError(f"expected an ODBBatch or a dict of tensors, got {type(batch).__name__}")


def fold_token_ids(inputs: Mapping[str, Tensor], token_id_fold: int) -> dict[str, Tensor]:
    """Inputs with ``input_ids`` and supervised ``labels`` taken modulo ``token_id_fold``."""
    folded = dict(inputs)
    folded["input_ids"] = inputs["input_ids"].remainder(token_id_fold)
    if "labels" in inputs:
        labels = inputs["labels"]
        folded["labels"] = torch.where(
            labels == IGNORE_INDEX, labels, labels.remainder(token_id_fold)
        )
    return folded


def check_optimization(optimizer: OptimizerFactory, scheduler: SchedulerFactory) -> None:
    """Build the optimizer and the schedule once on a probe parameter, so that a bad
    ``model.optimizer`` or ``model.scheduler`` fails at construction, naming its node."""
    try:
        probe = optimizer([{"params": [nn.Parameter(torch.zeros(1))]}])
    except (TypeError, ValueError, IndexError, KeyError) as error:
        raise ValueError(
            f"model.optimizer {plain(optimizer)} builds no optimizer: {type(error).__name__}: "
            f"{error}"
        ) from None
    try:
        scheduler(probe)
    except (TypeError, KeyError) as error:
        raise ValueError(
            f"model.scheduler {plain(scheduler)} builds no LR scheduler: {error}"
        ) from None


ConcernT = TypeVar("ConcernT")


def concern(value: ConcernT | None, cls: type[ConcernT], key: str) -> ConcernT:
    """``value``, or ``cls()`` (its defaults, which the generated Hydra node also holds) for
    ``None``; anything else (a scalar set over the node) is refused naming ``key``."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        fields = ", ".join(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        raise ValueError(
            f"{key} must be a {cls.__name__} node (fields: {fields}), got {value!r}: set "
            f"its fields ({key}.<field>=...)"
        )
    return value


SAMPLES_SEEN_KEY = "odb_samples_seen"
"""Checkpoint key of the samples the sample-budget LR schedule has seen."""


class CausalLMModule(TokenWeightedLossMixin, pl.LightningModule):
    """Trains a causal LM with the exact token-weighted loss of :class:`TokenWeightedLossMixin`.

    Builds a random init of ``architecture`` (any ``transformers`` model type) or loads its
    ``pretrained_path``, in :meth:`configure_model`, which the trainer calls on the
    training device (deferred and sharded under FSDP2: :mod:`~odb_lightning.lit.model.setup`);
    without a trainer, call it once yourself. The decoder body gets every input but
    ``labels`` (:func:`~odb_lightning.lit.model.attention_inputs.body_inputs`); the LM head scores
    only supervised positions (:func:`~odb_lightning.lit.model.lm_head.chunked_lm_loss`).

    The hyperparameters saved in checkpoints are the arguments as plain nodes
    (:func:`~odb_lightning.core.nodes.plain`), which ``hydra.utils.instantiate`` turns back
    into the same arguments.

    Args:
        optimizer: ``model.optimizer``, a partial optimizer called with two parameter
            groups: the matrices (decayed with the optimizer's ``weight_decay``) and the
            vectors (never decayed).
        scheduler: ``model.scheduler``, a partial LR scheduler called with the optimizer
            and stepped once per optimizer step (a
            :class:`~odb_lightning.lit.model.lr_schedule.WarmupSchedule` learns the run's length
            at the start when it needs one).
        architecture: What is built (:class:`~odb_lightning.lit.model.config.Architecture`;
            ``None``: its defaults, as for the other concerns).
        finetuning: Which weights train (:class:`~odb_lightning.lit.model.config.Finetuning`).
        runtime: Dtypes, compile, activation checkpointing
            (:class:`~odb_lightning.lit.model.config.ModelRuntime`).
        step: Token-target steps and the LM-head chunk
            (:class:`~odb_lightning.lit.model.config.StepPolicy`).
        run: The run's facts; the sample-budget cosine reads its training sample count.
    """

    def __init__(
        self,
        *,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory,
        architecture: Architecture | None = None,
        finetuning: Finetuning | None = None,
        runtime: ModelRuntime | None = None,
        step: StepPolicy | None = None,
        run: RunContext | None = None,
    ) -> None:
        architecture = concern(architecture, Architecture, "model.architecture")
        finetuning = concern(finetuning, Finetuning, "model.finetuning")
        runtime = concern(runtime, ModelRuntime, "model.runtime")
        step = concern(step, StepPolicy, "model.step")
        super().__init__(tokens_per_step=step.tokens_per_step)
        check_optimization(optimizer, scheduler)
        self.architecture, self.finetuning, self.runtime = architecture, finetuning, runtime
        self.step_policy, self.run = step, run
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.save_hyperparameters(self.hyperparameters())
        self.token_id_fold = architecture.fold
        self.loss_chunk_tokens = step.loss_chunk_tokens
        # Device-side count of batches whose labels disagree with their metadata's
        # supervised-token count; read once per optimizer step (forward avoids host syncs).
        self._token_mismatches: Tensor | None = None
        self._samples_seen = 0
        self._scheduler: LRScheduler | None = None
        self._parameter_counts: dict[str, Any] | None = None
        self.random_init = architecture.random_init()
        self.model: PreTrainedModel | nn.Module | None = None  # built by configure_model
        self.val_loss = MeanMetric()

    def hyperparameters(self) -> dict[str, Any]:
        """The constructor's arguments (but ``run``) as plain nodes, for checkpoints."""
        parts = {
            "optimizer": self.optimizer_factory,
            "scheduler": self.scheduler_factory,
            "architecture": self.architecture,
            "finetuning": self.finetuning,
            "runtime": self.runtime,
            "step": self.step_policy,
        }
        return {name: plain(part) for name, part in parts.items()}

    def checked_vocab_size(self) -> int | None:
        """The vocabulary the loaders check token ids against
        (:meth:`~odb_lightning.lit.model.config.Architecture.checked_vocab_size`)."""
        return self.architecture.checked_vocab_size()

    @override
    def configure_model(self) -> None:
        """Build the model (once): on the trainer's device, and under FSDP2 on ``meta``,
        sharded per decoder layer with this module as the root, then materialized per
        shard. Without a trainer: on the current default device."""
        if self.model is None:
            self._parameter_counts = build_model(self, self._trainer)

    def parameter_counts(self) -> dict[str, Any]:
        """Trainable and total parameters of the model, counted when it was built (before
        any strategy shards or partitions it: the whole model, on every rank)."""
        if self._parameter_counts is None:
            raise RuntimeError("the model is built by configure_model()")
        return dict(self._parameter_counts)

    def compile_report(self) -> dict[str, float] | None:
        """Graphs, recompiles and compile seconds so far with ``compile``, else ``None``."""
        return compile_counts() if self.runtime.compile else None

    @override
    def forward(
        self, inputs: Mapping[str, Tensor], meta: StepMeta | None = None
    ) -> tuple[Tensor, int]:
        """Summed token cross-entropy of a batch and its supervised-token count.

        With the step's ``meta`` (an :class:`ODBBatch` from this package's
        collates, in any row layout), the padded batch runs without its attention mask and the LM
        head gathers the supervised rows by the metadata's count, both without a host
        sync (:func:`~odb_lightning.lit.model.attention_inputs.body_inputs`,
        :func:`~odb_lightning.lit.model.lm_head.chunked_lm_loss`); the count is checked lazily,
        once per optimizer step.
        """
        if "labels" not in inputs:
            raise ValueError(f"batch has no 'labels' (keys: {sorted(inputs)})")
        if self.model is None:
            raise RuntimeError(
                "the model is built by configure_model(): the trainer calls it; without "
                "a trainer, call module.configure_model() once"
            )
        if self.token_id_fold is not None:
            inputs = fold_token_ids(inputs, self.token_id_fold)
        body = self.model.get_decoder()
        kwargs = body_inputs(
            inputs, self.architecture.attn_implementation, right_padded=meta is not None
        )
        hidden = body(**kwargs, use_cache=False).last_hidden_state
        labels = inputs["labels"]
        known = None if meta is None else meta.local_loss_tokens
        if known is not None and not meta.is_idle:  # an IDLE dummy's labels do not count
            mismatch = loss_token_mismatch(labels, known)
            pending = self._token_mismatches
            self._token_mismatches = mismatch if pending is None else pending + mismatch
        return chunked_lm_loss(
            hidden, labels, self.model.get_output_embeddings(), self.loss_chunk_tokens, known
        )

    def check_loss_token_counts(self) -> None:
        """Raise if a batch since the last check had labels that disagree with its step
        metadata's supervised-token count (one host sync)."""
        pending, self._token_mismatches = self._token_mismatches, None
        if pending is not None and int(pending):
            raise ValueError(
                f"{int(pending)} batch(es) since the last optimizer step had labels whose "
                "supervised-token count (shifted labels != -100) differs from their step "
                "metadata's local_loss_tokens: a collate_fn changed the labels after the "
                "metadata was counted"
            )

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.check_loss_token_counts()
        super().on_before_optimizer_step(optimizer)

    @override
    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self.check_loss_token_counts()

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        inputs, meta = split_batch(batch)
        if meta is not None:
            # The same on every rank: global_samples is this step position's total.
            self._samples_seen += meta.global_samples
        loss_sum, num_loss_tokens = self(inputs, meta)
        # An IDLE batch is a dummy: the mixin weights it 0 and counts none of its tokens.
        return self.token_weighted_loss(loss_sum, num_loss_tokens, meta)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        inputs, meta = split_batch(batch)
        # IDLE batches run the forward too: under a sharded strategy it issues the
        # all-gathers the other ranks' forwards wait for. Their loss is not counted.
        loss_sum, num_loss_tokens = self(inputs, meta)
        if num_loss_tokens and (meta is None or not meta.is_idle):
            # A mean weighted by token counts, summed over ranks when computed:
            # sum(loss_sum) / sum(count) over every rank, not a mean of rank means.
            self.val_loss.update(loss_sum.detach() / num_loss_tokens, num_loss_tokens)
        # Logged on IDLE steps too: every rank must take part in the epoch-end sync.
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # The sample-budget schedule's position (the same on every rank).
        checkpoint[SAMPLES_SEEN_KEY] = self._samples_seen

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._samples_seen = int(checkpoint.get(SAMPLES_SEEN_KEY, 0))

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        matrices = [p for p in self.parameters() if p.requires_grad and p.ndim >= 2]
        vectors = [p for p in self.parameters() if p.requires_grad and p.ndim < 2]
        optimizer = self.optimizer_factory(
            [{"params": matrices}, {"params": vectors, "weight_decay": 0.0}]
        )
        self._scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self._scheduler, "interval": "step"},
        }

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        schedule = self._scheduler
        if isinstance(schedule, WarmupSchedule) and schedule.needs_length:
            self._give_length(schedule)

    def _give_length(self, schedule: WarmupSchedule) -> None:
        """The cosine's length: the trainer's estimated steps (``max_steps`` alone with
        ``tokens_per_step``), else (ODB epochs have no length before they run) the planned
        samples, ``progress = samples seen / (training samples x max_epochs)``: a
        sample-budget schedule that closes exactly because every sample is emitted once per
        epoch. Asked here, after a strategy that restores checkpoints after setup (FSDP2)
        has given the loader its state, and before the first step."""
        # Lightning answers max_steps (-1 when unset) for a loader without a length. With
        # tokens_per_step, token counts close the steps: batches say nothing of their number.
        estimate = (
            self.trainer.estimated_stepping_batches
            if self.tokens_per_step is None
            else self.trainer.max_steps
        )
        if not math.isinf(estimate) and estimate > 0:
            schedule.run_for(int(estimate))
            return
        planned = self._planned_samples()
        schedule.follow(lambda: self._samples_seen / planned)

    def _planned_samples(self) -> int:
        per_epoch = None if self.run is None else self.run.train_samples.get()
        epochs = self.trainer.max_epochs
        if not per_epoch or epochs is None or epochs < 1:
            raise ValueError(
                "a cosine schedule needs a length: set model.scheduler.decay_steps or "
                "trainer.max_steps, or give the module a run context whose training sample "
                "count the data module fills, and a trainer.max_epochs"
            )
        return per_epoch * epochs
