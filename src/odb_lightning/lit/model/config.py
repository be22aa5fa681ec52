"""The model's configuration by concern: architecture, fine-tuning, runtime, step policy.

Each concern is a frozen dataclass whose fields are the keys of its Hydra node
(``model.architecture.*``, ``model.finetuning.*``, ``model.runtime.*``, ``model.step.*``);
each field's doc sits under it, and each check names the key. The optimizer and the LR
schedule are not here: they are partially instantiated nodes (``model.optimizer``,
``model.scheduler``) that the module calls with its parameter groups and its optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from odb_lightning.core.checks import check_bool, check_int, check_positive_int, enum_member

if TYPE_CHECKING:  # imported where used: the config is validated before torch loads
    import torch
    from transformers import PretrainedConfig


class ModelDType(StrEnum):
    """Parameter dtype of the model."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.value)


class FinetuningMethod(StrEnum):
    """Which weights train: all of them, or LoRA adapters only."""

    FULL = "full"
    LORA = "lora"


ARCHITECTURE_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
)
"""The sizes of a random init, passed to ``transformers.AutoConfig.for_model``."""


@dataclass(frozen=True)
class Architecture:
    """What model is built (``model.architecture``): a random init of a ``transformers``
    model type from these sizes, or a local checkpoint."""

    model_type: str = "qwen2"
    """A ``transformers`` model type (``qwen2``, ``llama``, ``qwen3``, ...): the random init
    is ``AutoConfig.for_model(model_type, <the sizes>)``. Unused with ``pretrained_path``."""
    pretrained_path: str | None = None
    """A local ``save_pretrained`` directory to fine-tune (no hub); its own config then
    gives the architecture, and the sizes below and ``token_id_fold`` are unused."""
    vocab_size: int = 151936
    """Embedding rows of a random init (ignored with ``token_id_fold``)."""
    hidden_size: int = 64
    """Width of the residual stream."""
    num_hidden_layers: int = 2
    """Decoder layers."""
    num_attention_heads: int = 4
    """Query heads (``hidden_size`` must be a multiple)."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention; divides ``num_attention_heads``)."""
    intermediate_size: int = 128
    """Width of each MLP."""
    head_dim: int | None = None
    """Width of each attention head; ``None``: the family's own default (``hidden_size /
    num_attention_heads`` for Qwen2 and Llama, 128 for Qwen3)."""
    max_position_embeddings: int = 32768
    """Longest position the rotary tables cover."""
    tie_word_embeddings: bool = True
    """The LM head shares the input embeddings."""
    token_id_fold: int | None = None
    """CPU benchmark stand-in: token ids are taken modulo this and the vocabulary shrinks to
    it, so the LM head stops dominating the cost (as it does not in a real LLM) while the
    real tokenizer and lengths are kept. Random init only (ignored with
    ``pretrained_path``, so ``debug=smoke`` also runs a pretrained model)."""
    attn_implementation: str = "sdpa"
    """The ``transformers`` attention backend (``sdpa``, ``eager``, ``flex_attention``,
    ``flash_attention_2``, ...)."""

    def __post_init__(self) -> None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if self.model_type not in CONFIG_MAPPING:
            raise ValueError(
                "model.architecture.model_type must be a transformers model type (qwen2, "
                f"llama, qwen3, ...), got {self.model_type!r}"
            )
        for name in ARCHITECTURE_SIZES:
            check_int(f"model.architecture.{name}", getattr(self, name), least=1)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.architecture.hidden_size ({self.hidden_size}) must be a multiple of "
                f"model.architecture.num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model.architecture.num_key_value_heads ({self.num_key_value_heads}) must "
                f"divide model.architecture.num_attention_heads ({self.num_attention_heads})"
            )
        for name in ("head_dim", "token_id_fold"):
            check_positive_int(f"model.architecture.{name}", getattr(self, name), optional=True)

    @property
    def fold(self) -> int | None:
        """The fold in effect: ``token_id_fold`` for a random init, ``None`` with
        ``pretrained_path``."""
        return self.token_id_fold if self.pretrained_path is None else None

    def random_init(self) -> PretrainedConfig:
        """The ``transformers`` config of a random init of these sizes (the vocabulary is
        the fold when there is one)."""
        from transformers import AutoConfig

        sizes = {name: getattr(self, name) for name in ARCHITECTURE_SIZES}
        sizes["vocab_size"] = self.token_id_fold or self.vocab_size
        if self.head_dim is not None:
            sizes["head_dim"] = self.head_dim
        return AutoConfig.for_model(
            self.model_type, tie_word_embeddings=self.tie_word_embeddings, **sizes
        )

    def embedding_rows(self) -> int:
        """Rows of the input embedding: the fold of a folded random init, the checkpoint's
        ``vocab_size`` with ``pretrained_path`` (an image-text model's: its language
        model's), else ``vocab_size``."""
        if self.pretrained_path is not None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self.pretrained_path)
            return int(config.get_text_config().vocab_size)
        return self.token_id_fold or self.vocab_size

    def attention_weight(self) -> float:
        """The model's ``w = layers x width / matmul parameters``
        (:mod:`~odb_lightning.core.flops`): its language model's, from the random init's
        sizes or the checkpoint's config (an image-text model's vision tower is bounded by
        the patch budget instead)."""
        from transformers import AutoConfig

        from odb_lightning.core.flops import attention_weight_of, decoder_matmul_parameters

        if self.pretrained_path is not None:
            text = AutoConfig.from_pretrained(self.pretrained_path).get_text_config()
        else:
            text = self.random_init()
        heads = text.num_attention_heads
        matmul = decoder_matmul_parameters(
            hidden_size=text.hidden_size,
            num_layers=text.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            intermediate_size=text.intermediate_size,
            vocab_size=text.vocab_size,
        )
        return attention_weight_of(text.num_hidden_layers, text.hidden_size, matmul)

    def checked_vocab_size(self) -> int | None:
        """The vocabulary the loaders check token ids against: ``None`` with a fold (any
        id is folded into range), else :meth:`embedding_rows`."""
        return None if self.fold is not None else self.embedding_rows()


DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of Qwen2/Llama-style decoders."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (``model.finetuning.lora``), through ``peft``."""

    r: int = 16
    """Adapter rank."""
    alpha: float = 32.0
    """Adapter scale numerator: the update is scaled by ``alpha / r``."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    """Names of the modules that get adapters."""

    def __post_init__(self) -> None:
        # Hydra hands lists; the frozen settings hold a tuple.
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        check_int("model.finetuning.lora.r", self.r, least=1)
        if self.alpha <= 0:
            raise ValueError(f"model.finetuning.lora.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(
                f"model.finetuning.lora.dropout must be in [0, 1), got {self.dropout!r}"
            )
        if not self.target_modules or not all(isinstance(t, str) for t in self.target_modules):
            raise ValueError(
                "model.finetuning.lora.target_modules must name modules, got "
                f"{list(self.target_modules)!r}"
            )


@dataclass(frozen=True)
class Finetuning:
    """Which weights train (``model.finetuning``)."""

    method: FinetuningMethod = FinetuningMethod.FULL
    """``full`` (every weight trains) or ``lora`` (adapters only; the base is frozen)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """The adapters of ``method=lora`` (validated even while unused)."""

    def __post_init__(self) -> None:
        method = enum_member(FinetuningMethod, "model.finetuning.method", self.method)
        object.__setattr__(self, "method", method)

    @property
    def adapters(self) -> LoraSettings | None:
        """The LoRA settings when LoRA trains, else ``None``."""
        return self.lora if self.method is FinetuningMethod.LORA else None


@dataclass(frozen=True)
class ModelRuntime:
    """How the model runs (``model.runtime``): dtypes, compile, activation checkpointing."""

    dtype: ModelDType = ModelDType.FLOAT32
    """Parameter dtype: ``float32`` (float32 master weights under ``bf16-mixed``),
    ``bfloat16`` (refused for a full fine-tune under a mixed trainer precision) or
    ``float64``."""
    fsdp_param_dtype: ModelDType | None = None
    """Under FSDP2 only: gather the float32 shards as this dtype for compute (``bfloat16``),
    reducing gradients in float32; ``None``: compute in the parameter dtype."""
    compile: bool = False
    """``torch.compile`` each decoder layer in place, with dynamic shapes; the summary
    reports the graphs, recompiles and compile seconds."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (the activations of one layer
    instead of all of them, for one more forward)."""

    def __post_init__(self) -> None:
        dtype = enum_member(ModelDType, "model.runtime.dtype", self.dtype)
        object.__setattr__(self, "dtype", dtype)
        if self.fsdp_param_dtype is not None:
            key = "model.runtime.fsdp_param_dtype"
            object.__setattr__(
                self, "fsdp_param_dtype", enum_member(ModelDType, key, self.fsdp_param_dtype)
            )
        for name in ("compile", "activation_checkpointing"):
            check_bool(f"model.runtime.{name}", getattr(self, name))


@dataclass(frozen=True)
class StepPolicy:
    """What one optimizer step and one LM-head chunk hold (``model.step``)."""

    tokens_per_step: int | None = None
    """Step the optimizer once the global supervised tokens since the last step reach this
    (token-target steps, :mod:`odb_lightning.lit.model.token_target`); ``None`` steps every
    ``trainer.accumulate_grad_batches`` micro-batches. Each step is built from several
    groups, or its samples would be of nearly one length and quality drop as under sorted
    batches: the run lowers an online mode's ``batching.token_budget`` to at most this
    (rounded down to 256) and pairs ``batching.policy.emission_order``, except for a key
    the command line names (``token_target.batching_for_steps``,
    ``experiments/quality/README.md``)."""
    loss_chunk_tokens: int = 1024
    """Supervised rows per LM-head chunk (the peak logits memory)."""

    def __post_init__(self) -> None:
        check_positive_int("model.step.tokens_per_step", self.tokens_per_step, optional=True)
        check_int("model.step.loss_chunk_tokens", self.loss_chunk_tokens, least=1)
