"""Training FLOPs of a dense decoder and the devices' peaks, for throughput and MFU."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PretrainedConfig

# Dense bf16 tensor-core peak (no sparsity), FLOP/s, by a substring of the CUDA device
# name; the first entry that matches wins, so the more specific names come first.
# (Lightning's ``get_available_flops`` does not recognise the plain "NVIDIA H200" name and
# lists its H200 figures with sparsity.)
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989.4e12,
    "H100 SXM": 989.4e12,
    "H100 80GB HBM3": 989.4e12,
    "H100 PCIe": 756.0e12,
    "H100": 989.4e12,
    "A100": 312.0e12,
    "L40S": 362.05e12,
}


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of one device named ``device_name`` (``None``: not in
    :data:`PEAK_BF16_FLOPS`, a CPU for one)."""
    for name, flops in PEAK_BF16_FLOPS.items():
        if name.lower() in device_name.lower():
            return flops
    return None


@dataclass(frozen=True)
class ModelFlops:
    """Training FLOPs (forward + backward) of a dense Qwen2/Llama-style decoder, by term.

    The ``6 N`` rule: a weight matrix with ``N`` entries costs ``2 N`` FLOPs per token
    forward and ``4 N`` backward (gradients of inputs and of weights). Attention scores and
    their weighted sum add ``2 * 2 * d_attn`` FLOPs per attended key per layer forward,
    ``12 * d_attn`` per (query, key) pair per layer for forward + backward. A causal sample
    of length ``L`` has ``L (L + 1) / 2`` such pairs. Embedding lookups, norms, biases and
    the softmax are left out (lower order).

    Attributes:
        per_token: The decoder layers' weights, per token (``6 N`` of the body).
        per_attended_key: Attention, per (query, key) pair, all layers.
        per_supervised_token: The LM head, per token run through it (the chunked head
            runs the supervised tokens only).
    """

    per_token: float
    per_attended_key: float
    per_supervised_token: float

    @classmethod
    def of(cls, config: PretrainedConfig) -> ModelFlops:
        """From ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
        ``num_key_value_heads``, ``intermediate_size``, ``vocab_size`` (and ``head_dim``
        when it is not ``hidden_size / num_attention_heads``)."""
        hidden = config.hidden_size
        head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
        q_width = config.num_attention_heads * head_dim
        kv_width = config.num_key_value_heads * head_dim
        # q and o projections, k and v projections, gate/up/down of the SwiGLU MLP.
        layer_weights = (
            2 * hidden * q_width + 2 * hidden * kv_width + 3 * hidden * config.intermediate_size
        )
        layers = config.num_hidden_layers
        return cls(
            per_token=6.0 * layers * layer_weights,
            per_attended_key=12.0 * layers * q_width,
            per_supervised_token=6.0 * config.vocab_size * hidden,
        )

    def step(self, lengths: Sequence[int], loss_tokens: int) -> float:
        """Model FLOPs of a step of causal samples of ``lengths`` with ``loss_tokens``
        supervised tokens: each sample attends within itself, whatever the batch's
        padding or packing (that work is the device's, not the model's)."""
        pairs = sum(length * (length + 1) // 2 for length in lengths)
        return (
            self.per_token * sum(lengths)
            + self.per_attended_key * pairs
            + self.per_supervised_token * loss_tokens
        )


def flops_per_token(config: PretrainedConfig, context_tokens: float = 0.0) -> dict[str, float]:
    """Training FLOPs per token of a dense decoder (:class:`ModelFlops`), at a mean context.

    Args:
        config: The model's configuration (see :meth:`ModelFlops.of`).
        context_tokens: Mean number of keys a token attends to: ``(L + 1) / 2`` for a
            causal sequence of length ``L`` with a causal kernel, ``L`` for a kernel that
            computes the full masked square; 0 gives the ``6 N`` part alone.

    Returns:
        ``{"body": ..., "head": ...}``: the transformer layers (with attention) and the LM
        head, for one token that is run through the head.
    """
    model = ModelFlops.of(config)
    body = model.per_token + model.per_attended_key * context_tokens
    return {"body": body, "head": model.per_supervised_token}
