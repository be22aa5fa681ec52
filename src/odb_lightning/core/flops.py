"""A row's cost in the model's own FLOPs: the attention weight of a decoder's shape.

Training a decoder of ``N`` matmul parameters (every weight a token multiplies: the
layers and the output head, not the input embedding's lookup) costs about ``6 N`` FLOPs
a token (forward and backward). Causal attention adds, per layer of width ``d`` and per
sequence of ``L`` tokens, ``L^2 / 2`` query-key pairs of ``2 d`` multiply-adds each for
the scores and as many for the weighted values: ``2 d L^2`` FLOPs forward, ``6 d L^2``
with the backward. Over ``l`` layers a row of ``L`` tokens costs

    6 N L + 6 l d L^2  =  6 N (L + w L^2),   w = l d / N,

so the budget's row cost ``L + w L^2`` (:class:`~odb_lightning.core.budget.Budget`) is
the row's training FLOPs in units of one token's linear FLOPs when ``attention_weight``
is :func:`attention_weight_of` the model's shape. A 7B Llama shape (32 layers, 4,096
wide, 6.6e9 matmul parameters) gives ``w`` of about 2.0e-5: attention is 16 % of the
linear work at 8,192 tokens and 65 % at 32,768. The kernel decides which ``L``: a padded
row attends over its padded length, a packed row over each sample (varlen) or the whole
row (a dense block mask), as the layouts charge it (:mod:`~odb_lightning.core.rows`).
"""

from __future__ import annotations

from odb_lightning.core.checks import check_positive_int


def attention_weight_of(num_layers: int, hidden_size: int, matmul_parameters: int) -> float:
    """``w = l d / N`` of a causal decoder of ``num_layers`` layers ``hidden_size`` wide
    with ``matmul_parameters`` weights that tokens multiply (see the module docstring)."""
    check_positive_int("num_layers", num_layers)
    check_positive_int("hidden_size", hidden_size)
    check_positive_int("matmul_parameters", matmul_parameters)
    return num_layers * hidden_size / matmul_parameters


def attention_share(weight: float, length: int) -> float:
    """A row's attention FLOPs over its linear FLOPs at ``length`` tokens: ``w L``."""
    return weight * length


def decoder_matmul_parameters(
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    vocab_size: int,
) -> int:
    """The weights a token multiplies in a Llama-style decoder (Qwen2, Qwen3, Llama): per
    layer the query and output projections (``d x heads x head_dim`` each), the key and
    value projections (``d x kv_heads x head_dim`` each) and the gated MLP
    (``3 x d x intermediate``), and the output head (``d x vocab``); biases and norms are
    left out (a ten-thousandth)."""
    attention = hidden_size * head_dim * (2 * num_heads + 2 * num_kv_heads)
    mlp = 3 * hidden_size * intermediate_size
    return num_layers * (attention + mlp) + hidden_size * vocab_size
