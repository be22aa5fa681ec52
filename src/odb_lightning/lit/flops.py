"""Training FLOPs per token of a dense decoder, for throughput and MFU figures."""

from __future__ import annotations

from transformers import PretrainedConfig


def flops_per_token(config: PretrainedConfig, context_tokens: float = 0.0) -> dict[str, float]:
    """Training FLOPs (forward + backward) per token of a dense Qwen2/Llama-style decoder.

    The ``6 N`` rule: a weight matrix with ``N`` entries costs ``2 N`` FLOPs per token
    forward and ``4 N`` backward (gradients of inputs and of weights). Attention scores and
    their weighted sum add ``2 * 2 * d_attn`` FLOPs per attended key per layer forward,
    ``12 * d_attn * context_tokens`` per layer for forward + backward. Embedding lookups,
    norms, biases and the softmax are left out (lower order).

    Args:
        config: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
            ``num_key_value_heads``, ``intermediate_size``, ``vocab_size`` (and
            ``head_dim`` when it is not ``hidden_size / num_attention_heads``).
        context_tokens: Mean number of keys a token attends to: ``(L + 1) / 2`` for a
            causal sequence of length ``L`` with a causal kernel, ``L`` for a kernel that
            computes the full masked square; 0 gives the ``6 N`` part alone.

    Returns:
        ``{"body": ..., "head": ...}``: the transformer layers (with attention) and the LM
        head, for one token that is run through the head.
    """
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    # q and o projections, k and v projections, gate/up/down of the SwiGLU MLP.
    layer_weights = (
        2 * hidden * q_width + 2 * hidden * kv_width + 3 * hidden * config.intermediate_size
    )
    layers = config.num_hidden_layers
    body = 6.0 * layers * layer_weights + 12.0 * layers * q_width * context_tokens
    head = 6.0 * config.vocab_size * hidden
    return {"body": body, "head": head}
