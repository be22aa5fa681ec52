"""Epoch plans of the planned modes (``standard``, ``sorted``, ``bucketed``, ``oracle``)
for the data module: each policy fitted to the cached lengths, then planned per epoch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.planners import plan_epoch

log = logging.getLogger(__name__)

PlanFn = Callable[[int], list[list[int]]]


def in_order_plan(num_samples: int, batch_size: int) -> PlanFn:
    """Fixed consecutive batches, the same every epoch (validation)."""
    batches = [
        list(range(start, min(start + batch_size, num_samples)))
        for start in range(0, num_samples, batch_size)
    ]
    return lambda epoch: [list(batch) for batch in batches]


def epoch_plan(lengths: Sequence[int], batching: BatchingConfig, num_samples: int) -> PlanFn:
    """``plan(epoch)`` for a planned training mode over ``num_samples`` samples.

    Args:
        lengths: Exact lengths (length-pass modes); ignored by ``standard``.
        batching: The policy and its knobs, fitted to the lengths
            (:meth:`~odb_lightning.core.policy.Policy.fitted`: ``bucketed`` without
            boundaries gets optimized ones).
        num_samples: Samples in the training set.
    """
    policy = batching.policy
    if not policy.needs_length_pass:
        return lambda epoch: plan_epoch([1] * num_samples, batching, epoch=epoch)
    if len(lengths) != num_samples:
        raise ValueError(f"mode '{batching.mode}' needs {num_samples} lengths, got {len(lengths)}")
    fitted, notes = policy.fitted(lengths, batching.token_budget)  # type: ignore[arg-type]
    for line in notes:
        log.info("%s", line)
    fitted_batching = replace(batching, policy=fitted)
    plan_lengths = list(lengths)
    return lambda epoch: plan_epoch(plan_lengths, fitted_batching, epoch=epoch)
