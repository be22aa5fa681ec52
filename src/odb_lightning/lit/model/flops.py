"""Training FLOPs of a dense decoder and the devices' peaks, for throughput and MFU."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PretrainedConfig

# Dense bf16 tensor-core peak (no sparsity), FLOP/s, by a model name in the CUDA device
# name, matched as a whole word (``H20`` is not ``H200``, ``B200`` is not ``GB200``); the
# first entry that matches wins, so a variant comes before its family's plain name.
# Sources: NVIDIA's data sheets, which give bf16 "with sparsity", halved here. On
# Blackwell, bf16 dense is an eighth of the FP4-with-sparsity figure (B200: 18 PFLOPS
# FP4 sparse, 2.25 PFLOPS bf16 dense), which gives the RTX PRO figures from their
# "AI TOPS". (Lightning's ``get_available_flops`` does not recognise the plain
# "NVIDIA H200" name and lists its H200 figures with sparsity.)
PEAK_BF16_FLOPS: dict[str, float] = {
    # Blackwell: HGX B200 data sheet (1,000 W), 4.5 PFLOPS bf16 sparse.
    "B200": 2250.0e12,
    # GB200 NVL72 data sheet: 360 PFLOPS bf16 sparse over 72 GPUs (1,200 W).
    "GB200": 2500.0e12,
    # HGX B100 (700 W): 3.5 PFLOPS bf16 sparse.
    "B100": 1750.0e12,
    # RTX PRO 6000 Blackwell data sheets: Max-Q Workstation Edition (300 W) 3,511 AI
    # TOPS; Workstation Edition (600 W) and Server Edition 4,000 AI TOPS (FP4 sparse).
    "RTX PRO 6000 Blackwell Max-Q": 438.9e12,
    "RTX PRO 6000 Blackwell": 500.0e12,
    # Hopper: H100/H200 data sheets, SXM 1,979, NVL 1,671 and PCIe 1,513 TFLOPS bf16
    # sparse; the H800 is the H100 with less NVLink; H20: 148 TFLOPS dense (its sheet).
    "H200": 989.4e12,
    "GH200": 989.4e12,
    "H100 NVL": 835.5e12,
    "H100 PCIe": 756.0e12,
    "H100": 989.4e12,
    "H800 PCIe": 756.0e12,
    "H800": 989.4e12,
    "H20": 148.0e12,
    # Ampere: A100 data sheet, 624 TFLOPS bf16 sparse; the A800 is the A100 with less
    # NVLink.
    "A100": 312.0e12,
    "A800": 312.0e12,
    # Ada: L40S 733 and L20 239 TFLOPS bf16 sparse (their data sheets).
    "L40S": 362.05e12,
    "L20": 119.5e12,
}


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of one device named ``device_name`` (``None``: not in
    :data:`PEAK_BF16_FLOPS`, a CPU for one)."""
    for name, flops in PEAK_BF16_FLOPS.items():
        if re.search(rf"(?<![0-9a-z]){re.escape(name)}(?![0-9a-z])", device_name, re.IGNORECASE):
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
