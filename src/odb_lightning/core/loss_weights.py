"""Token-weighted loss algebra.

Goal: the gradient of one optimizer step equals the gradient of the mean per-token loss
over every supervised token the step saw, on all ranks and all accumulated micro-batches:

    L = (1 / N) * sum_{r, k, t} l_{r,k,t},    N = sum_{r, k} n_{r,k}

where ``l_{r,k,t}`` is the cross-entropy of supervised token ``t`` in micro-batch ``k`` on
rank ``r`` and ``n_{r,k}`` its count of supervised tokens (shifted ``labels != -100``).

DDP averages gradients over the ``W`` ranks, and accumulation sums micro-batch gradients:

    g = (1 / W) * sum_r sum_k grad(loss_{r,k})

Choosing ``loss_{r,k} = (W / N) * sum_t l_{r,k,t}`` (sum reduction, divided by the
*global* supervised-token count, times the world size) gives
``g = (1 / W) * sum_{r,k} (W / N) * sum_t grad(l_{r,k,t}) = grad(L)``, exactly.

A per-rank mean (``sum_t l / n_{r,k}``) instead weights every rank equally whatever its
token count, which biases the loss when ODB gives ranks different numbers of tokens.

``N`` comes from the step metadata: each step's global supervised-token count is known
after the alignment round's one exchange, so no second collective is needed. When ``N``
spans micro-batches that have not been seen yet (accumulation), the same identity is
applied in two factors: backpropagate ``W * sum_t l`` and multiply the accumulated
gradients by ``1 / N`` before the optimizer step.

IDLE steps keep the collectives aligned and contribute nothing: their loss is multiplied
by 0 (``N`` excludes them because they carry no supervised token).
"""

from __future__ import annotations


def rank_loss_scale(world_size: int, global_loss_tokens: int) -> float:
    """Factor for this rank's summed token loss: ``W / N`` (0 when ``N`` is 0)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if global_loss_tokens < 0:
        raise ValueError(f"global_loss_tokens must be >= 0, got {global_loss_tokens}")
    return world_size / global_loss_tokens if global_loss_tokens else 0.0


def gradient_scale(global_loss_tokens_per_micro_batch: list[int]) -> float:
    """``1 / N`` for gradients accumulated from losses scaled by ``W`` only."""
    total = sum(global_loss_tokens_per_micro_batch)
    return 1.0 / total if total else 0.0


def token_target_boundaries(global_loss_tokens: list[int], tokens_per_step: int) -> list[int]:
    """Indices of the micro-batches that close an optimizer step.

    A step closes as soon as the cumulative global supervised-token count reaches
    ``tokens_per_step``; every rank sees the same counts, so every rank takes the same
    decision. A trailing partial step is closed by the last micro-batch.
    """
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
    boundaries: list[int] = []
    running = 0
    for index, count in enumerate(global_loss_tokens):
        running += count
        if running >= tokens_per_step:
            boundaries.append(index)
            running = 0
    if global_loss_tokens and (not boundaries or boundaries[-1] != len(global_loss_tokens) - 1):
        boundaries.append(len(global_loss_tokens) - 1)
    return boundaries
