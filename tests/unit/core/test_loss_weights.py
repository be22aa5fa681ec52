"""The loss-weight algebra reproduces the global per-token mean (pure-Python check; the
torch gradient check against one process lives with the Lightning module tests)."""

from __future__ import annotations

import pytest

from odb_lightning.core.loss_weights import (
    gradient_scale,
    rank_loss_scale,
    token_target_boundaries,
)
from odb_lightning.core.order import make_rng


def test_scaled_rank_losses_average_to_the_global_token_mean() -> None:
    rng = make_rng(3, "loss")
    world = 4
    # token losses[r][k] for rank r, micro-batch k: uneven token counts, one IDLE.
    losses = [
        [[rng.random() for _ in range(rng.randint(0, 30))] for _ in range(3)] for _ in range(world)
    ]
    losses[2][1] = []
    every_token = [t for rank in losses for micro in rank for t in micro]
    total_tokens = len(every_token)
    # DDP averages over ranks; accumulation sums micro-batches.
    ddp_value = (
        sum(rank_loss_scale(world, total_tokens) * sum(micro) for rank in losses for micro in rank)
        / world
    )
    assert ddp_value == pytest.approx(sum(every_token) / total_tokens, rel=1e-12)
    # Two-factor form: backprop W * sum, then scale accumulated gradients by 1 / N.
    per_micro_global = [sum(len(losses[r][k]) for r in range(world)) for k in range(3)]
    two_factor = (
        gradient_scale(per_micro_global)
        * sum(world * sum(micro) for rank in losses for micro in rank)
        / world
    )
    assert two_factor == pytest.approx(ddp_value, rel=1e-12)


def test_zero_tokens_scale_is_zero_and_bad_inputs_raise() -> None:
    assert rank_loss_scale(8, 0) == 0.0
    assert gradient_scale([0, 0]) == 0.0
    with pytest.raises(ValueError):
        rank_loss_scale(0, 10)


def test_token_target_boundaries() -> None:
    assert token_target_boundaries([5, 5, 5, 20, 1], 10) == [1, 3, 4]
    assert token_target_boundaries([10, 10], 10) == [0, 1]
    assert token_target_boundaries([], 10) == []
    with pytest.raises(ValueError):
        token_target_boundaries([1], 0)
