"""Causal-LM LightningModule over Hugging Face ``transformers`` with a chunked LM head."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric
from transformers import PreTrainedModel, Qwen2Config
from typing_extensions import override

from odb_lightning.lit.lm_head import chunked_lm_loss, loss_token_mismatch
from odb_lightning.lit.loss import TokenWeightedLossMixin
from odb_lightning.lit.lr_schedule import LRSchedule, lr_factor
from odb_lightning.lit.model_setup import (
    Finetuning,
    LoraSettings,
    ModelDType,
    add_lora,
    build_causal_lm,
    check_master_weights,
    compile_counts,
    compile_decoder_layers,
    count_parameters,
    data_parallel_mesh,
    enable_activation_checkpointing,
    enum_choice,
    materialize,
    shard,
)
from odb_lightning.lit.packed_inputs import body_inputs
from odb_lightning.runtime.batch import ODBBatch, StepMeta
from odb_lightning.sample import IGNORE_INDEX


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


SAMPLES_SEEN_KEY = "odb_samples_seen"
"""Checkpoint key of the samples the sample-budget LR schedule has seen."""


class CausalLMModule(TokenWeightedLossMixin, pl.LightningModule):
    """Trains a causal LM with the exact token-weighted loss of :class:`TokenWeightedLossMixin`.

    Builds a randomly initialised Qwen2 model whose ``Qwen2Config`` fields are the
    architecture arguments (``vocab_size`` to ``tie_word_embeddings``), or loads
    ``pretrained_path`` (a local ``save_pretrained`` directory; they are then unused).
    The model is built in :meth:`configure_model`, which the trainer calls on the
    training device (deferred and sharded under FSDP2: :mod:`~odb_lightning.lit.model_setup`);
    without a trainer, call it once yourself. The
    decoder body gets every input but ``labels``
    (:func:`~odb_lightning.lit.packed_inputs.body_inputs`); the LM head scores only
    supervised positions (:func:`~odb_lightning.lit.lm_head.chunked_lm_loss`).

    Args:
        pretrained_path: Local checkpoint directory, or ``None`` for a random init.
        vocab_size: Ignored with ``token_id_fold``.
        token_id_fold: CPU benchmark stand-in: token ids are taken modulo this and the
            vocabulary shrinks to it, so the LM head stops dominating the cost (as it does
            not in a real LLM) while the real tokenizer and lengths are kept. Random init
            only: ignored with ``pretrained_path``, like the architecture arguments (so
            ``debug=smoke`` also runs a pretrained model).
        model_dtype: Parameter dtype: ``float32`` (the default: float32 master weights
            under ``bf16-mixed``), ``bfloat16`` (refused with a mixed trainer precision)
            or ``float64``.
        attn_implementation: ``transformers`` attention backend.
        loss_chunk_tokens: Supervised rows per LM-head chunk (peak logits memory).
        lr: Peak learning rate of AdamW (``betas`` are its betas).
        weight_decay: Decoupled weight decay of matrices (vectors are not decayed).
        warmup_steps: Optimizer steps of linear warmup.
        min_lr_ratio: Final learning rate of the cosine as a fraction of ``lr``.
        scheduler: ``cosine`` or ``constant`` after warmup.
        decay_steps: Optimizer steps of warmup plus cosine; ``None``: the trainer's
            estimate (``trainer.max_steps`` when set), else the samples planned for the
            run (a sample-budget cosine).
        tokens_per_step: Step the optimizer once the global supervised tokens since the
            last step reach this (token-target steps, see
            :mod:`odb_lightning.lit.token_target`); ``None`` steps every
            ``trainer.accumulate_grad_batches`` micro-batches.
        finetuning: ``full`` (every weight trains) or ``lora`` (adapters only, through
            ``peft``; the base weights are frozen).
        lora: LoRA settings, used with ``finetuning=lora``: ``r``, ``alpha``, ``dropout``,
            ``target_modules`` (:class:`~odb_lightning.lit.model_setup.LoraSettings`).
        gradient_checkpointing: Recompute each decoder layer's activations in backward
            (memory for compute: activations of one layer instead of all of them).
        fsdp_param_dtype: Under FSDP2 only: gather the float32 shards as this dtype for
            compute (``bfloat16``), reducing gradients in float32; ``None``: compute in
            the parameter dtype (with autocast under ``bf16-mixed``).
        compile: ``torch.compile`` each decoder layer in place, with dynamic shapes
            (:func:`~odb_lightning.lit.model_setup.compile_decoder_layers`); the summary
            reports the graphs, recompiles and compile seconds.
    """

    def __init__(
        self,
        pretrained_path: str | None = None,
        vocab_size: int = 151936,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        intermediate_size: int = 128,
        max_position_embeddings: int = 32768,
        tie_word_embeddings: bool = True,
        token_id_fold: int | None = None,
        model_dtype: ModelDType | str = "float32",
        attn_implementation: str = "sdpa",
        loss_chunk_tokens: int = 1024,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        betas: Sequence[float] = (0.9, 0.95),
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.1,
        scheduler: LRSchedule | str = "cosine",
        decay_steps: int | None = None,
        tokens_per_step: int | None = None,
        finetuning: Finetuning | str = "full",
        lora: LoraSettings | dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        fsdp_param_dtype: ModelDType | str | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__(tokens_per_step=tokens_per_step)
        # Plain defaults (strings, not enum members): checkpoints load with weights_only.
        self.save_hyperparameters()
        _check_arguments(token_id_fold, pretrained_path, loss_chunk_tokens, lr, betas, min_lr_ratio)
        self.finetuning = enum_choice(Finetuning, finetuning, "finetuning")
        lora_settings = LoraSettings.of(lora)  # validated even while unused
        self.lora = lora_settings if self.finetuning is Finetuning.LORA else None
        self.model_dtype = enum_choice(ModelDType, model_dtype, "model_dtype")
        self.gradient_checkpointing = bool(gradient_checkpointing)
        if not isinstance(compile, bool):
            raise ValueError(f"compile must be true or false, got {compile!r}")
        self.compile_layers = compile
        # Device-side count of batches whose labels disagree with their metadata's
        # supervised-token count; read once per optimizer step (forward avoids host syncs).
        self._token_mismatches: Tensor | None = None
        self.fsdp_param_dtype = (
            None
            if fsdp_param_dtype is None
            else enum_choice(ModelDType, fsdp_param_dtype, "fsdp_param_dtype")
        )
        self.token_id_fold = token_id_fold if pretrained_path is None else None
        self.loss_chunk_tokens = loss_chunk_tokens
        self.lr, self.weight_decay = lr, weight_decay
        self.betas = (float(betas[0]), float(betas[1]))
        self.warmup_steps, self.min_lr_ratio = warmup_steps, min_lr_ratio
        self.scheduler = enum_choice(LRSchedule, scheduler, "scheduler")
        self.decay_steps = decay_steps
        self._samples_seen = 0
        self._decay: Callable[[int], float] | None = None  # the cosine, once its length is known
        self._decay_factor: Callable[..., float] | None = None
        self._parameter_counts: dict[str, Any] | None = None
        self.random_init = Qwen2Config(
            vocab_size=token_id_fold or vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=tie_word_embeddings,
        )
        self.model: PreTrainedModel | nn.Module | None = None  # built by configure_model
        self.val_loss = MeanMetric()

    @override
    def configure_model(self) -> None:
        """Build the model (once): on the trainer's device, and under FSDP2 on ``meta``,
        sharded per decoder layer with this module as the root, then materialized per
        shard. Without a trainer: on the current default device."""
        if self.model is not None:
            return
        trainer = self._trainer
        strategy = trainer.strategy if trainer is not None else None
        if trainer is not None:
            check_master_weights(self.model_dtype, str(trainer.precision), self.finetuning)
        mesh = data_parallel_mesh(strategy)
        if self.fsdp_param_dtype is not None and mesh is None:
            raise ValueError(
                "fsdp_param_dtype needs FSDP2 (trainer.strategy ModelParallelStrategy); "
                "under other strategies use trainer.precision=bf16-mixed"
            )
        dtype = self.model_dtype.torch_dtype
        model: nn.Module = build_causal_lm(
            self.hparams.pretrained_path,
            self.random_init,
            dtype,
            self.hparams.attn_implementation,
            on_meta=mesh is not None,
        )
        # from_pretrained returns the model in eval mode, and Lightning keeps the modes it
        # finds (with a warning): dropout of a checkpoint that has it must train.
        model.train()
        if self.gradient_checkpointing:
            enable_activation_checkpointing(model)
        if self.lora is not None:
            model = add_lora(model, self.lora)
        if self.compile_layers:
            compile_decoder_layers(model)
        self.model = model
        self._parameter_counts = count_parameters(model, self.finetuning)
        if mesh is not None:
            param_dtype = (
                None if self.fsdp_param_dtype is None else self.fsdp_param_dtype.torch_dtype
            )
            shard(self, model, mesh, param_dtype)
            materialize(
                model,
                strategy.root_device,
                self.hparams.pretrained_path,
                dtype,
                is_rank_zero=trainer.global_rank == 0,
            )

    def parameter_counts(self) -> dict[str, Any]:
        """Trainable and total parameters of the model, counted when it was built (before
        any strategy shards or partitions it: the whole model, on every rank)."""
        if self._parameter_counts is None:
            raise RuntimeError("the model is built by configure_model()")
        return dict(self._parameter_counts)

    def compile_report(self) -> dict[str, float] | None:
        """Graphs, recompiles and compile seconds so far with ``compile``, else ``None``."""
        return compile_counts() if self.compile_layers else None

    @override
    def forward(
        self, inputs: Mapping[str, Tensor], meta: StepMeta | None = None
    ) -> tuple[Tensor, int]:
        """Summed token cross-entropy of a batch and its supervised-token count.

        With the step's ``meta`` (an :class:`ODBBatch`: right padded or packed by this
        package's collates), the padded batch runs without its attention mask and the LM
        head gathers the supervised rows by the metadata's count, both without a host
        sync (:func:`~odb_lightning.lit.packed_inputs.body_inputs`,
        :func:`~odb_lightning.lit.lm_head.chunked_lm_loss`); the count is checked lazily,
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
            inputs, self.hparams.attn_implementation, right_padded=meta is not None
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
        optimizer = torch.optim.AdamW(
            [
                {"params": matrices, "weight_decay": self.weight_decay},
                {"params": vectors, "weight_decay": 0.0},
            ],
            lr=self.lr,
            betas=self.betas,
        )
        scheduler = LambdaLR(optimizer, self._schedule())
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _schedule(self) -> Callable[[int], float]:
        """The LR multiplier by optimizer step.

        The cosine runs over ``decay_steps``, else over the trainer's estimated steps
        (``max_steps`` alone with ``tokens_per_step``), else (ODB epochs have no length
        before they run) over the planned samples:
        ``progress = samples seen / (training samples x max_epochs)``, a sample-budget
        schedule that closes exactly because every sample is emitted once per epoch.
        """
        factor = partial(
            lr_factor,
            warmup_steps=self.warmup_steps,
            min_lr_ratio=self.min_lr_ratio,
            schedule=self.scheduler,
        )
        if self.decay_steps is not None or self.scheduler is LRSchedule.CONSTANT:
            return partial(factor, decay_steps=self.decay_steps or 0)
        self._decay = None

        def schedule(step: int) -> float:
            # Step 0 (LambdaLR's first call, inside configure_optimizers) needs no length.
            # Asking the trainer for one there would fetch a batch before a strategy that
            # restores checkpoints after setup (FSDP2) has given the loader its state;
            # on_train_start resolves it, after the restore and before the first step.
            if self._decay is None:
                if step == 0:
                    return factor(0, decay_steps=0)
                self._decay = self._decay_schedule(factor)
            return self._decay(step)

        self._decay_factor = factor
        return schedule

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        factor = self._decay_factor
        if factor is not None and self._decay is None:
            self._decay = self._decay_schedule(factor)  # fails here, not at step 1

    def _decay_schedule(self, factor: Callable[..., float]) -> Callable[[int], float]:
        # Lightning answers max_steps (-1 when unset) for a loader without a length. With
        # tokens_per_step, token counts close the steps: batches say nothing of their number.
        estimate = (
            self.trainer.estimated_stepping_batches
            if self.tokens_per_step is None
            else self.trainer.max_steps
        )
        if not math.isinf(estimate) and estimate > 0:
            return partial(factor, decay_steps=int(estimate))
        planned = self._planned_samples()
        return lambda step: factor(step, decay_steps=0, progress=self._samples_seen / planned)

    def _planned_samples(self) -> int:
        datamodule = getattr(self.trainer, "datamodule", None)
        per_epoch = getattr(datamodule, "num_train_samples", None)
        epochs = self.trainer.max_epochs
        if not per_epoch or epochs is None or epochs < 1:
            raise ValueError(
                "a cosine schedule needs a length: set model.decay_steps or trainer.max_steps, "
                "or train with a data module that reports num_train_samples and a max_epochs"
            )
        return per_epoch * epochs


def _check_arguments(
    token_id_fold: int | None,
    pretrained_path: str | None,
    loss_chunk_tokens: int,
    lr: float,
    betas: Sequence[float],
    min_lr_ratio: float,
) -> None:
    if token_id_fold is not None and token_id_fold < 1:
        raise ValueError(f"token_id_fold must be >= 1 or null, got {token_id_fold}")
    if loss_chunk_tokens < 1:
        raise ValueError(f"loss_chunk_tokens must be >= 1, got {loss_chunk_tokens}")
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if len(betas) != 2:
        raise ValueError(f"betas must have two entries, got {list(betas)}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
