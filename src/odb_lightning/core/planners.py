"""Offline epoch plans for every batching mode, and their padding statistics.

A plan is the list of batches one epoch emits on one rank, each batch a list of indices
into ``lengths``; every index appears exactly once. The length-pass modes (``sorted``,
``bucketed``, ``oracle``) need the lengths up front; ``standard`` ignores them; ``odb``
replays the online runtime through the simulator on a single rank, so the plan is what
production would emit for that arrival order.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig, BatchingMode, resolve_config
from odb_lightning.core.grouping import group_lengths
from odb_lightning.core.order import epoch_permutation, make_rng
from odb_lightning.core.simulate import simulate


@dataclass(frozen=True, slots=True)
class PlanStats:
    """Padding statistics of one epoch plan.

    Attributes:
        steps: Non-empty batches.
        mean_batch_size: Samples per step.
        padding_efficiency: Real tokens / padded tokens (1.0 for packed batches).
        budget_fill: Mean padded tokens per step / ``token_budget``; above 1 when a mode
            that ignores the budget (``standard``, ``sorted``) overshoots it.
        over_budget_samples: Samples that alone cost more than the budget.
        over_budget_batches: Multi-sample batches that cost more than the budget.
        real_tokens: Sum of sample lengths.
        padded_tokens: Sum over batches of ``size * longest`` (real tokens when packed).
    """

    steps: int
    mean_batch_size: float
    padding_efficiency: float
    budget_fill: float
    over_budget_samples: int
    over_budget_batches: int
    real_tokens: int
    padded_tokens: int


def validate_lengths(lengths: Sequence[int]) -> None:
    """Raise ``ValueError`` naming the first index whose length is not a positive int."""
    for index, length in enumerate(lengths):
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(
                f"lengths[{index}] must be a positive integer token count, got {length!r}"
            )


def bucket_of(lengths: Sequence[int], boundaries: Sequence[int]) -> list[int]:
    """Bucket index of every sample: bucket ``i`` holds ``edge_i <= length < edge_{i+1}``.

    Raises:
        ValueError: If the edges are not strictly increasing integers (at least two), or
            a sample falls outside ``[edge_0, edge_k)``; the message names the sample.
    """
    if len(boundaries) < 2:
        raise ValueError(f"boundaries needs at least 2 edges (1 bucket), got {boundaries!r}")
    for index, edge in enumerate(boundaries):
        if not isinstance(edge, int) or isinstance(edge, bool) or edge < 0:
            raise ValueError(f"boundaries[{index}] must be a non-negative integer, got {edge!r}")
        if index and edge <= boundaries[index - 1]:
            raise ValueError(f"boundaries must be strictly increasing, got {list(boundaries)}")
    if lengths:
        longest = max(range(len(lengths)), key=lambda i: (lengths[i], -i))
        if lengths[longest] >= boundaries[-1]:
            raise ValueError(
                f"boundaries: last edge {boundaries[-1]} must exceed the longest sample "
                f"(lengths[{longest}] = {lengths[longest]})"
            )
        shortest = min(range(len(lengths)), key=lambda i: (lengths[i], i))
        if lengths[shortest] < boundaries[0]:
            raise ValueError(
                f"boundaries: first edge {boundaries[0]} is above the shortest sample "
                f"(lengths[{shortest}] = {lengths[shortest]})"
            )
    return [bisect.bisect_right(boundaries, length) - 1 for length in lengths]


def pack_in_order(
    order: Sequence[int],
    lengths: Sequence[int],
    budget: Budget,
    *,
    max_batch_size: int | None = None,
) -> list[list[int]]:
    """Cut ``order`` into consecutive padded batches greedily, never reordering it.

    A batch closes when the next sample would push ``g * row_cost(L_max)`` over the
    budget or when it already has ``max_batch_size`` samples. A sample that alone
    exceeds the budget gets a batch of its own.
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for index in order:
        length = lengths[index]
        fits = budget.fits(len(batch) + 1, max(longest, length))
        full = max_batch_size is not None and len(batch) >= max_batch_size
        if batch and (full or not fits):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    return batches


def _chunk(order: list[int], size: int) -> list[list[int]]:
    return [order[start : start + size] for start in range(0, len(order), size)]


def _shuffled(batches: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    make_rng(seed, "batches", epoch).shuffle(batches)
    return batches


def _plan_bucketed(
    lengths: Sequence[int],
    boundaries: Sequence[int],
    budget: Budget,
    max_batch_size: int | None,
    seed: int,
    epoch: int,
) -> list[list[int]]:
    buckets: list[list[int]] = [[] for _ in range(len(boundaries) - 1)]
    for index, bucket in enumerate(bucket_of(lengths, boundaries)):
        buckets[bucket].append(index)
    rng = make_rng(seed, "buckets", epoch)
    batches: list[list[int]] = []
    for members in buckets:
        # A fresh in-bucket shuffle each epoch is what changes batch composition.
        rng.shuffle(members)
        batches += pack_in_order(members, lengths, budget, max_batch_size=max_batch_size)
    return _shuffled(batches, seed, epoch)


def _plan_oracle(
    lengths: Sequence[int], budget: Budget, max_batch_size: int | None, seed: int, epoch: int
) -> list[list[int]]:
    batches = group_lengths(list(lengths), budget, max_group_size=max_batch_size)
    return _shuffled(batches, seed, epoch)


def _plan_odb(lengths: Sequence[int], config: BatchingConfig, epoch: int) -> list[list[int]]:
    order = epoch_permutation(len(lengths), config.seed, epoch)
    (steps,) = simulate([[lengths[i] for i in order]], config, epoch=epoch)
    # One rank never idles: T never exceeds its own group count.
    return [[order[j] for j in step] for step in steps]


def plan_epoch(
    lengths: Sequence[int],
    config: BatchingConfig | None = None,
    *,
    epoch: int = 0,
    **knobs: object,
) -> list[list[int]]:
    """Plan one epoch on one rank with ``config.mode``.

    ``standard`` chunks the epoch permutation into ``batch_size``; ``sorted`` chunks the
    global (length, index) sort into ``batch_size`` and shuffles the batch order per
    epoch; ``bucketed`` shuffles inside each bucket of ``boundaries``, packs greedily
    under the budget and ``max_batch_size``, and shuffles the batch list; ``oracle``
    groups the global longest-first sort under the budget (capped by ``max_batch_size``)
    and shuffles the batch order; ``odb`` and ``odb_packed`` run the single-rank
    simulator over the epoch permutation with the configured window.

    Args:
        lengths: Token length of every sample (positive integers).
        config: The batching settings; fields a mode does not use are ignored.
        epoch: Epoch number; changes every shuffle.
        **knobs: :class:`~odb_lightning.core.config.BatchingConfig` fields that replace
            those of ``config`` (or make a config of their own).

    Returns:
        Batches of indices into ``lengths``, each index exactly once, in emission order.

    Raises:
        ValueError: Naming the sample index of a bad length, or a bucketed plan without
            boundaries.
    """
    config = resolve_config(config, knobs)
    validate_lengths(lengths)
    mode, seed = config.mode, config.seed
    if mode is BatchingMode.STANDARD:
        return _chunk(epoch_permutation(len(lengths), seed, epoch), config.batch_size)
    if mode is BatchingMode.SORTED:
        # Static composition: the sort ignores the epoch; only the batch order moves.
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        return _shuffled(_chunk(order, config.batch_size), seed, epoch)
    if mode is BatchingMode.BUCKETED:
        if not config.boundaries:
            raise ValueError("batching.boundaries are required for mode 'bucketed'")
        return _plan_bucketed(
            lengths, config.boundaries, config.budget, config.max_batch_size, seed, epoch
        )
    if mode is BatchingMode.ORACLE:
        return _plan_oracle(lengths, config.budget, config.max_batch_size, seed, epoch)
    return _plan_odb(lengths, config, epoch)


def summarize_plan(
    lengths: Sequence[int],
    batches: Sequence[Sequence[int]],
    token_budget: int,
    *,
    attention_weight: float = 0.0,
    packed: bool = False,
) -> PlanStats:
    """Padding statistics of ``batches`` (indices into ``lengths``) against the budget.

    Empty (IDLE) batches are not steps and are skipped. With ``packed`` (``odb_packed``)
    batches are emitted padding-free: padded tokens equal real tokens.
    """
    budget = Budget(token_budget, attention_weight)
    steps = samples = real = padded = over_samples = over_batches = 0
    for batch in batches:
        if not batch:
            continue
        batch_lengths = [lengths[i] for i in batch]
        longest = max(batch_lengths)
        steps += 1
        samples += len(batch)
        real += sum(batch_lengths)
        padded += sum(batch_lengths) if packed else len(batch) * longest
        over_samples += sum(budget.is_over_budget(n) for n in batch_lengths)
        cost = (
            budget.packed_cost(sum(batch_lengths), sum(n * n for n in batch_lengths))
            if packed
            else budget.cost(len(batch), longest)
        )
        over_batches += len(batch) > 1 and cost > token_budget
    return PlanStats(
        steps=steps,
        mean_batch_size=samples / steps if steps else 0.0,
        padding_efficiency=real / padded if padded else 1.0,
        budget_fill=padded / steps / token_budget if steps else 0.0,
        over_budget_samples=over_samples,
        over_budget_batches=over_batches,
        real_tokens=real,
        padded_tokens=padded,
    )
