"""A tiny float64 Qwen2 ``CausalLMModule`` and its batch helpers."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Sequence
from functools import partial
from typing import Any, TypeVar

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.nn.utils import vector_to_parameters
from torch.utils.data import DataLoader

from odb_lightning.lit.model.config import (
    Architecture,
    Finetuning,
    LoraSettings,
    ModelRuntime,
    StepPolicy,
)
from odb_lightning.lit.model.lr_schedule import WarmupSchedule
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import ODBBatch, StepMeta, idle_sample, pad_collate

VOCAB = 256  # differs from every other dimension, so [*, VOCAB] tensors are logits

Sample = tuple[Tensor, Tensor]
ModuleT = TypeVar("ModuleT", bound=CausalLMModule)


OPTIMIZER = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.0}
"""conf/model/tiny_qwen2.yaml's AdamW settings."""
SCHEDULE = {"shape": "cosine", "warmup_steps": 0, "min_lr_ratio": 0.1, "decay_steps": None}
"""conf/model/tiny_qwen2.yaml's LR schedule."""
RENAMED = {
    "model_dtype": "dtype",
    "gradient_checkpointing": "activation_checkpointing",
    "scheduler": "shape",
}
"""Flat test knobs spelled as their concern's field."""


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def module_arguments(**knobs: Any) -> dict[str, Any]:
    """Constructor arguments of a ``CausalLMModule`` from flat knobs, each routed to the
    concern that has the field (``hidden_size`` to ``architecture``, ``lr`` to the
    optimizer, ``scheduler`` to the schedule's ``shape``, ``finetuning`` to its
    ``method``, ``lora`` to its settings); other names pass through unchanged."""
    knobs = {RENAMED.get(name, name): value for name, value in knobs.items()}
    concerns: dict[str, dict[str, Any]] = {
        "architecture": {}, "runtime": {}, "step": {}, "optimizer": {}, "scheduler": {},
        "finetuning": {},
    }  # fmt: skip
    owners = {
        "architecture": _fields(Architecture),
        "runtime": _fields(ModelRuntime),
        "step": _fields(StepPolicy),
        "optimizer": set(OPTIMIZER),
        "scheduler": set(SCHEDULE),
    }
    rest: dict[str, Any] = {}
    for name, value in knobs.items():
        owner = next((o for o, fields in owners.items() if name in fields), None)
        if name == "finetuning":
            concerns["finetuning"]["method"] = value
        elif name == "lora":
            lora = dict(value)
            concerns["finetuning"]["lora"] = LoraSettings(**lora)
        elif owner is None:
            rest[name] = value
        else:
            concerns[owner][name] = value
    return rest | {
        "architecture": Architecture(**concerns["architecture"]),
        "finetuning": Finetuning(**concerns["finetuning"]),
        "runtime": ModelRuntime(**concerns["runtime"]),
        "step": StepPolicy(**concerns["step"]),
        "optimizer": partial(torch.optim.AdamW, **(OPTIMIZER | concerns["optimizer"])),
        "scheduler": partial(WarmupSchedule, **(SCHEDULE | concerns["scheduler"])),
    }


def tiny_arguments(**overrides: Any) -> dict[str, Any]:
    """Constructor arguments of a tiny float64 Qwen2 causal LM, with ``overrides`` (flat
    knobs, routed by :func:`module_arguments`)."""
    arguments: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        model_dtype="float64",
    )
    arguments.update(overrides)
    return module_arguments(**arguments)


def tiny_module(module_class: type[ModuleT] = CausalLMModule, **overrides: Any) -> ModuleT:
    """A tiny module with seeded (reproducible) initial weights, its model built."""
    torch.manual_seed(0)
    module = module_class(**tiny_arguments(**overrides))
    module.configure_model()
    return module


def make_sample(length: int, prompt: int, seed: int, vocab: int = VOCAB) -> Sample:
    """Token ids and labels with the first ``prompt`` positions unsupervised."""
    ids = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[:prompt] = -100
    return ids, labels


def seeded_samples(
    lengths: Sequence[int], prompt: int = 2, seed: int = 0, vocab: int = VOCAB
) -> list[Sample]:
    """Samples of the given lengths drawn from one seeded generator, in order, each with
    its first ``prompt`` positions unsupervised."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for length in lengths:
        ids = torch.randint(0, vocab, (length,), generator=generator)
        labels = ids.clone()
        labels[:prompt] = -100
        samples.append((ids, labels))
    return samples


def pad(samples: Sequence[Sample]) -> dict[str, Tensor]:
    """Right-padded batch: pad id 0, mask 0, label -100."""
    return pad_collate([{"input_ids": ids, "labels": labels} for ids, labels in samples])


def loss_tokens(batch: dict[str, Tensor]) -> int:
    """Supervised tokens of a batch: the shifted labels that are not -100."""
    return int((batch["labels"][:, 1:] != -100).sum())


def full_loss_sum(model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Reference: full logits from the Hugging Face forward, then summed cross-entropy."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )


def flat_params(module: torch.nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()


def flat_grad(module: torch.nn.Module) -> Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()]).clone()


def trainable_grad(module: torch.nn.Module) -> Tensor:
    """The flat gradient of the parameters that require one (LoRA: the adapters)."""
    return torch.cat([p.grad.reshape(-1) for p in module.parameters() if p.requires_grad]).clone()


def whole(tensor: Tensor) -> Tensor:
    """The whole tensor of a sharded ``DTensor`` (a collective: every rank must call it in
    the same order), or ``tensor`` itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gathered_params(module: torch.nn.Module) -> Tensor:
    """Every parameter, flat and whole (FSDP2 shards gathered), as :func:`flat_params`."""
    return torch.cat([whole(p.detach()).reshape(-1) for p in module.parameters()]).clone()


def gathered_trainable_grad(module: torch.nn.Module) -> Tensor:
    """The flat, whole gradient of the trainable parameters, as :func:`trainable_grad`."""
    grads = [whole(p.grad).reshape(-1) for p in module.parameters() if p.requires_grad]
    return torch.cat(grads).clone()


def grads_of(module: torch.nn.Module, loss: Tensor) -> Tensor:
    """The flat gradient of ``loss`` alone (earlier gradients cleared)."""
    module.zero_grad(set_to_none=True)
    loss.backward()
    return flat_grad(module)


def rel_err(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


def union_gradient(
    base: CausalLMModule,
    samples: Sequence[Sample],
    params: Tensor | None = None,
    *,
    trainable_only: bool = False,
) -> tuple[Tensor, float]:
    """Gradient and value of the per-token mean loss over ``samples`` (at ``params``, else
    at ``base``'s weights): one process, one padded batch, full logits. ``params`` holds
    every parameter; ``trainable_only`` returns the gradient of the trainable ones only."""
    reference = copy.deepcopy(base)
    reference.configure_model()
    if params is not None:
        vector_to_parameters(params, reference.parameters())
    union = pad(samples)
    loss = full_loss_sum(reference.model, union) / loss_tokens(union)
    loss.backward()
    return (trainable_grad if trainable_only else flat_grad)(reference), loss.item()


def step_batches(
    rank_steps: Sequence[Sequence[Sequence[Sample] | None]],
    idle: Collection[tuple[int, int]] = (),
    with_global_count: bool = True,
) -> list[list[ODBBatch]]:
    """Every rank's micro-batches with the metadata the ODB runtime would give them.

    Args:
        rank_steps: ``rank_steps[rank][step]``: that micro-batch's samples, or ``None`` for
            an IDLE step carrying the runtime's one-token dummy.
        idle: ``(rank, step)`` pairs that are IDLE yet carry their samples (supervised
            labels that must count for nothing).
        with_global_count: ``False`` leaves ``global_loss_tokens`` unset, as planned
            modes do.
    """
    num_steps = len(rank_steps[0])
    assert all(len(steps) == num_steps for steps in rank_steps)
    inputs = [
        [pad_collate([idle_sample(0)]) if s is None else pad(s) for s in steps]
        for steps in rank_steps
    ]
    is_idle = [
        [s is None or (r, k) in idle for k, s in enumerate(steps)]
        for r, steps in enumerate(rank_steps)
    ]
    counts = [
        [0 if is_idle[r][k] else loss_tokens(b) for k, b in enumerate(batches)]
        for r, batches in enumerate(inputs)
    ]
    sizes = [
        [0 if is_idle[r][k] else len(s or ()) for k, s in enumerate(steps)]
        for r, steps in enumerate(rank_steps)
    ]
    batches = []
    for r in range(len(rank_steps)):
        rank = []
        for k in range(num_steps):
            real = 0 if is_idle[r][k] else int(inputs[r][k]["attention_mask"].sum())
            padded = 0 if is_idle[r][k] else inputs[r][k]["input_ids"].numel()
            total = sum(c[k] for c in counts)
            meta = StepMeta(
                sample_ids=(),
                is_idle=is_idle[r][k],
                local_samples=sizes[r][k],
                local_real_tokens=real,
                local_padded_tokens=padded,
                local_loss_tokens=counts[r][k],
                global_samples=sum(s[k] for s in sizes),
                global_loss_tokens=total if with_global_count else None,
                round_index=0,
                step=k,
                epoch=0,
            )
            rank.append(ODBBatch(inputs[r][k], meta))
        batches.append(rank)
    return batches


def quiet_trainer(**kwargs: Any) -> pl.Trainer:
    """A ``pl.Trainer`` that writes nothing: no logger, checkpoints, progress bar or summary."""
    return pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def hand_over(batch: Any) -> Any:
    """Identity collate: with ``batch_size=None`` each prepared batch goes over as it is."""
    return batch


def fit_on_cpu(module: pl.LightningModule, batches: list[Any], **trainer_kwargs: Any) -> pl.Trainer:
    """Fit ``module`` on the prepared ``batches`` in this one CPU process, no validation."""
    trainer = quiet_trainer(accelerator="cpu", devices=1, limit_val_batches=0, **trainer_kwargs)
    loader = DataLoader(batches, batch_size=None, collate_fn=hand_over)
    trainer.fit(module, train_dataloaders=loader)
    return trainer


def qwen2_linears(
    hidden: int, heads: int, kv_heads: int, intermediate: int
) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each projection of one Qwen2 decoder layer."""
    head_dim = hidden // heads
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    return {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }
