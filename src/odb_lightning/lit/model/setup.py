"""Building the causal LM inside ``configure_model`` (:func:`build_model`): on the
training device, deferred and sharded layer by layer under FSDP2, with LoRA adapters,
activation checkpointing and float32 master weights.

Lightning calls ``configure_model`` inside the strategy's init context: under DDP the model
is built straight on the rank's device (no host copy); under ``ModelParallelStrategy``
(FSDP2) on ``meta``, each decoder layer and then the LightningModule get ``fully_shard``,
and only then is this rank's shard allocated and filled (random init, or a local
checkpoint read on rank 0 and scattered). The LightningModule is the root because its
``forward`` calls the decoder body and the LM head directly: the embeddings, the final norm
and the (tied) head are root parameters, gathered when its ``forward`` starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PretrainedConfig,
    PreTrainedModel,
)

from odb_lightning.lit.model.config import FinetuningMethod, ModelDType
from odb_lightning.lit.model.lora import add_lora, reset_lora


def count_parameters(model: nn.Module, finetuning: FinetuningMethod) -> dict[str, Any]:
    """Trainable and total parameters of a model as built (before a strategy shards or
    partitions it; ``meta`` tensors count by their shape)."""
    total = trainable = 0
    for parameter in model.parameters():
        total += parameter.numel()
        trainable += parameter.numel() if parameter.requires_grad else 0
    return {
        "finetuning": finetuning.value,
        "trainable_parameters": trainable,
        "total_parameters": total,
    }


HALF_MIXED_PRECISIONS = frozenset({"bf16-mixed", "16-mixed"})
"""Trainer precisions that autocast and expect float32 master weights."""


def check_master_weights(
    model_dtype: ModelDType, precision: str, finetuning: FinetuningMethod
) -> None:
    """Refuse trained half-precision parameters under a mixed-precision trainer.

    ``bf16-mixed`` autocasts the compute and leaves the optimizer on the parameters as
    they are: bfloat16 parameters then get no float32 master copy, and AdamW updates
    smaller than bfloat16's resolution (8 bits of mantissa) vanish. A frozen bfloat16
    base under LoRA is fine: ``peft`` keeps the adapters, which train, in float32. FSDP2
    can keep float32 shards and gather bfloat16 copies for compute instead
    (``model.runtime.fsdp_param_dtype``).

    Raises:
        ValueError: A full fine-tune in bfloat16 under a mixed precision.
    """
    trained_in_bf16 = model_dtype is ModelDType.BFLOAT16 and finetuning is FinetuningMethod.FULL
    if trained_in_bf16 and precision in HALF_MIXED_PRECISIONS:
        raise ValueError(
            f"model.runtime.dtype=bfloat16 with trainer.precision={precision} trains without "
            "float32 master weights (AdamW updates below bfloat16's resolution are lost): "
            "keep model.runtime.dtype=float32 (autocast computes in bfloat16), or under FSDP2 "
            "set model.runtime.fsdp_param_dtype=bfloat16 (float32 shards, bfloat16 compute "
            "copies); a bfloat16 base is fine with model.finetuning.method=lora"
        )


def data_parallel_mesh(strategy: Any) -> Any | None:
    """The data-parallel device mesh of an FSDP2 (``ModelParallelStrategy``) run, else
    ``None``.

    Raises:
        ValueError: The strategy also runs tensor parallelism: every ODB rank must get
            its own batches, and tensor-parallel peers would need the same ones.
    """
    if not isinstance(strategy, ModelParallelStrategy):
        return None
    mesh = strategy.device_mesh
    if mesh["tensor_parallel"].size() != 1:
        raise ValueError(
            "ODB shards the data over every rank: ModelParallelStrategy needs "
            f"tensor_parallel_size=1 and data_parallel_size=<world size>, got a mesh {mesh}"
        )
    return mesh["data_parallel"]


def model_class(config: PretrainedConfig | str) -> Any:
    """The ``transformers`` auto class of a config (or of a checkpoint directory): image-text
    models (a config with a ``vision_config``: a vision family's) are not causal-LM classes."""
    if isinstance(config, str):
        config = AutoConfig.from_pretrained(config)
    vision = getattr(config, "vision_config", None) is not None
    return AutoModelForImageTextToText if vision else AutoModelForCausalLM


def build_causal_lm(
    pretrained_path: str | None,
    config: PretrainedConfig,
    dtype: torch.dtype,
    attn_implementation: str,
    *,
    on_meta: bool = False,
) -> PreTrainedModel:
    """Load ``pretrained_path`` (a local directory), or initialise ``config`` at random.

    ``on_meta`` builds the architecture without memory (the weights come later, per
    shard: :func:`materialize`).
    """
    if on_meta:
        if pretrained_path is not None:
            config = AutoConfig.from_pretrained(pretrained_path)
        with torch.device("meta"):
            return model_class(config).from_config(
                config, dtype=dtype, attn_implementation=attn_implementation
            )
    if pretrained_path is not None:
        return model_class(pretrained_path).from_pretrained(
            pretrained_path, dtype=dtype, attn_implementation=attn_implementation
        )
    return model_class(config).from_config(
        config, dtype=dtype, attn_implementation=attn_implementation
    )


def build_model(module: Any, trainer: Any | None) -> dict[str, Any]:
    """Build ``module.model`` as its configuration asks (``module.architecture``,
    ``module.runtime``, ``module.finetuning``, ``module.random_init``): on the trainer's
    device, or under FSDP2 on ``meta``, sharded per decoder layer with ``module`` as the
    root and then materialized per shard.

    Returns:
        The model's parameter counts (:func:`count_parameters`), before any sharding.

    Raises:
        ValueError: ``fsdp_param_dtype`` without FSDP2, or bfloat16 master weights.
    """
    architecture, runtime = module.architecture, module.runtime
    method = module.finetuning.method
    strategy = trainer.strategy if trainer is not None else None
    if trainer is not None:
        check_master_weights(runtime.dtype, str(trainer.precision), method)
    mesh = data_parallel_mesh(strategy)
    if runtime.fsdp_param_dtype is not None and mesh is None:
        raise ValueError(
            "model.runtime.fsdp_param_dtype needs FSDP2 (trainer.strategy "
            "ModelParallelStrategy); under other strategies use trainer.precision=bf16-mixed"
        )
    dtype, path = runtime.dtype.torch_dtype, architecture.pretrained_path
    model: nn.Module = build_causal_lm(
        path, module.random_init, dtype, architecture.attn_implementation, on_meta=mesh is not None
    )
    # from_pretrained returns the model in eval mode, and Lightning keeps the modes it
    # finds (with a warning): dropout of a checkpoint that has it must train.
    model.train()
    if runtime.activation_checkpointing:
        enable_activation_checkpointing(model)
    if module.finetuning.adapters is not None:
        model = add_lora(model, module.finetuning.adapters)
    if runtime.compile:
        compile_decoder_layers(model)
    module.model = model
    counts = count_parameters(model, method)
    if mesh is not None:
        param_dtype = runtime.fsdp_param_dtype
        shard(module, model, mesh, None if param_dtype is None else param_dtype.torch_dtype)
        is_rank_zero = trainer.global_rank == 0
        materialize(model, strategy.root_device, path, dtype, is_rank_zero=is_rank_zero)
    return counts


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant), with the
    API of the installed ``transformers`` (renamed from gradient to activation
    checkpointing in 5.x)."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


COMPILE_RECOMPILE_LIMIT = 16
"""Most graphs Dynamo keeps per compiled frame before it falls back to eager. With dynamic
shapes a decoder layer needs one graph for batches of one row (a size-1 dimension is
always specialized) and one for the rest; the margin covers a user's extra cases."""


def compile_decoder_layers(model: nn.Module) -> int:
    """Compile every decoder layer of ``model`` in place (``nn.Module.compile``), with
    dynamic shapes: ODB batch shapes change every step, and a static compile would
    recompile per shape until Dynamo gives up. Compiling ``model.model`` instead would do
    nothing: ``get_decoder()`` hands back the uncompiled inner module, and that is what the
    forward calls. Call before sharding (``fully_shard`` wraps the compiled layers).

    Returns:
        The number of layers compiled.
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, COMPILE_RECOMPILE_LIMIT
    )
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def compile_counts(compiled_frames: int = 1) -> dict[str, float]:
    """What Dynamo compiled in this process so far: ``compile_graphs`` (distinct graphs),
    ``compile_recompiles`` (frame compilations beyond the first of each of the
    ``compiled_frames`` compiled functions: one for the layers of one decoder class) and
    ``compile_s`` (seconds in Dynamo's frame compilation, the forward graphs and their
    lowering; the backward graphs compile lazily, at the first backward, and are not in it).
    """
    from torch._dynamo.utils import compilation_time_metrics, counters

    frames = int(counters["frames"]["ok"])
    seconds = sum(compilation_time_metrics.get("_compile.compile_inner", ()))
    return {
        "compile_graphs": int(counters["stats"]["unique_graphs"]),
        "compile_recompiles": max(0, frames - compiled_frames),
        "compile_s": round(float(seconds), 3),
    }


def decoder_layers(model: nn.Module) -> Sequence[nn.Module]:
    """The decoder layers of a Hugging Face causal LM (or of a LoRA-wrapped one)."""
    body = model.get_decoder()
    layers = getattr(body, "layers", None)
    if layers is None:
        raise TypeError(f"{type(body).__name__} has no 'layers' to shard one by one")
    return layers


def shard(root: nn.Module, model: nn.Module, mesh: Any, param_dtype: torch.dtype | None) -> None:
    """``fully_shard`` each decoder layer of ``model``, then ``root`` (which holds the
    embeddings, final norm and head). With ``param_dtype`` the float32 shards are
    gathered as that dtype for compute, and gradients reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    kwargs = {"mesh": mesh} if param_dtype is None else {"mesh": mesh, "mp_policy": policy}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)


def _hf_key(key: str) -> str:
    """A state-dict key of the (LoRA-wrapped) model, spelled as in the checkpoint."""
    key = key.removeprefix("base_model.model.")
    return key.replace(".base_layer.", ".")


@torch.no_grad()
def materialize(
    model: nn.Module,
    device: torch.device,
    pretrained_path: str | None,
    dtype: torch.dtype,
    *,
    is_rank_zero: bool,
) -> None:
    """Allocate this rank's shards of a model built on ``meta`` and fill them.

    Random init uses the model's own initialisation (rotary tables included); LoRA
    adapters start as LoRA does. ``pretrained_path`` is read on rank 0 only and each
    shard is scattered from it (``broadcast_from_rank0``): one host copy per job, not
    one per rank.

    Raises:
        ValueError: On every rank, when rank 0 cannot read ``pretrained_path`` or it
            lacks a weight of the model (named).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in hf_model.modules():
        module._is_hf_initialized = False
    with torch.random.fork_rng(devices=[]):
        if device.type == "cpu" and dist.is_initialized():
            # DTensor's random ops keep shards apart only on accelerators; on CPU every
            # rank would draw the same numbers for its own shard.
            torch.manual_seed(torch.initial_seed() + dist.get_rank())
        hf_model.initialize_weights()  # also the rotary tables, which no checkpoint holds
        reset_lora(model)
    if pretrained_path is None:
        return
    full: dict[str, torch.Tensor] = {}
    problem = None
    if is_rank_zero:
        try:
            loaded, info = model_class(pretrained_path).from_pretrained(
                pretrained_path, dtype=dtype, output_loading_info=True
            )
            weights = loaded.state_dict()
        except (OSError, ValueError, RuntimeError) as error:
            problem = (
                f"rank 0 could not load model.architecture.pretrained_path {pretrained_path}: "
                f"{error}"
            )
        else:
            keys = [k for k in model.state_dict() if "lora_" not in k]
            # Weights the files lack (from_pretrained would initialise them at random), and
            # tensors of this model the loaded one does not have.
            missing = list(info.get("missing_keys", ()))
            missing += [k for k in keys if _hf_key(k) not in weights]
            if missing:
                problem = (
                    f"model.architecture.pretrained_path {pretrained_path} has no weights for "
                    f"{missing[:5]} "
                    f"({len(missing)} of {len(keys)} tensors): not a checkpoint of this model"
                )
            full = {key: weights[_hf_key(key)] for key in keys if _hf_key(key) in weights}
    # Every rank learns rank 0's outcome before the scatter, so none waits in it alone.
    outcome: list[str | None] = [problem]
    if dist.is_initialized():
        dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise ValueError(outcome[0])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, full, options=options)
