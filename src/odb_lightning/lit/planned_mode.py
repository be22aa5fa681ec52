"""Epoch plans of the planned modes (``standard``, ``sorted``, ``bucketed``, ``oracle``)
for the data module, and the bucket edges of ``bucketed``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from odb_lightning.core.buckets import bucket_table, optimize_boundaries
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.policy import BucketedPolicy

log = logging.getLogger(__name__)

PlanFn = Callable[[int], list[list[int]]]


def in_order_plan(num_samples: int, batch_size: int) -> PlanFn:
    """Fixed consecutive batches, the same every epoch (validation)."""
    batches = [
        list(range(start, min(start + batch_size, num_samples)))
        for start in range(0, num_samples, batch_size)
    ]
    return lambda epoch: [list(batch) for batch in batches]


def resolve_boundaries(
    lengths: Sequence[int], policy: BucketedPolicy, token_budget: int
) -> list[int]:
    """The configured bucket edges, or edges optimized on the cached lengths (logged as a
    table: range, count, mean length, batch size, efficiency)."""
    # No cap (null) is a cap of the whole epoch to the optimizer's model.
    max_batch_size = policy.max_batch_size or max(1, len(lengths))
    if policy.boundaries:
        edges = list(policy.boundaries)
        how = "configured"
    else:
        started = time.perf_counter()
        edges = optimize_boundaries(
            lengths,
            policy.num_buckets,
            token_budget=token_budget,
            max_batch_size=max_batch_size,
        )
        how = f"optimized in {time.perf_counter() - started:.2f} s"
    rows = bucket_table(lengths, edges, token_budget=token_budget, max_batch_size=max_batch_size)
    log.info("bucket edges %s (%s)", edges, how)
    log.info("%16s %8s %9s %6s %11s", "range", "count", "mean len", "batch", "efficiency")
    for row in rows:
        log.info(
            "%16s %8d %9.0f %6d %10.1f%%",
            f"[{row.lo}, {row.hi})",
            row.count,
            row.mean_length,
            row.batch_size,
            100 * row.efficiency,
        )
    return edges


def epoch_plan(lengths: Sequence[int], batching: BatchingConfig, num_samples: int) -> PlanFn:
    """``plan(epoch)`` for a planned training mode over ``num_samples`` samples.

    Args:
        lengths: Exact lengths (length-pass modes); ignored by ``standard``.
        batching: The policy and its knobs; ``bucketed`` without boundaries gets
            optimized ones.
        num_samples: Samples in the training set.
    """
    policy = batching.policy
    if policy.needs_length_pass and len(lengths) != num_samples:
        raise ValueError(f"mode '{batching.mode}' needs {num_samples} lengths, got {len(lengths)}")
    if isinstance(policy, BucketedPolicy):
        budget: int = batching.token_budget  # type: ignore[assignment]
        edges = tuple(resolve_boundaries(lengths, policy, budget))
        batching = replace(batching, policy=replace(policy, boundaries=edges))
    plan_lengths = list(lengths) if policy.needs_length_pass else [1] * num_samples
    return lambda epoch: plan_epoch(plan_lengths, batching, epoch=epoch)
