"""The attention weight of a decoder's shape: a row's training FLOPs in units of one
token's linear FLOPs (``core/flops.py``)."""

from __future__ import annotations

import pytest

from odb_lightning.core.budget import Budget
from odb_lightning.core.flops import attention_share, attention_weight_of


def test_a_7b_llama_shape_pays_16_and_65_percent_for_attention_at_8k_and_32k() -> None:
    # 32 layers of 4,096: 32 x (4 x 4096^2 + 3 x 4096 x 11008) + the 32,000 x 4,096 head.
    matmul = 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096
    weight = attention_weight_of(32, 4096, matmul)
    assert attention_share(weight, 8192) == pytest.approx(0.16, abs=0.01)
    assert attention_share(weight, 32768) == pytest.approx(0.65, abs=0.01)
    # The budget's row cost is then the row's FLOPs over 6N: linear plus causal attention.
    layers, width, length = 32, 4096, 8192
    flops = 6 * matmul * length + 6 * layers * width * length**2
    assert Budget(65536, weight).row_cost(length) == pytest.approx(flops / (6 * matmul))


def test_a_shape_that_is_not_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        attention_weight_of(2, 0, 1000)
