"""The offline plans of the planned modes, as pure functions of lengths, budget and seed.

A plan is the list of batches one epoch emits on one rank, each batch a list of indices
into ``lengths``; every index appears exactly once. The policies of
:mod:`~odb_lightning.core.policy` call these; :func:`~odb_lightning.core.planners.plan_epoch`
is the keyword form over every mode, and :func:`summarize_plan` measures a plan.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.budget import Budget
from odb_lightning.core.checks import is_int
from odb_lightning.core.grouping import group_lengths
from odb_lightning.core.order import make_rng
from odb_lightning.core.rows import PaddedRows, RowLayout


def validate_lengths(lengths: Sequence[int]) -> None:
    """Raise ``ValueError`` naming the first index whose length is not a positive int."""
    for index, length in enumerate(lengths):
        if not is_int(length) or length < 1:
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
        if not is_int(edge) or edge < 0:
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


def chunk(order: list[int], size: int) -> list[list[int]]:
    """``order`` cut into consecutive batches of ``size`` (the last may be shorter)."""
    return [order[start : start + size] for start in range(0, len(order), size)]


def shuffled(batches: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    """``batches`` in the seeded order of ``epoch`` (shuffled in place)."""
    make_rng(seed, "batches", epoch).shuffle(batches)
    return batches


def plan_bucketed(
    lengths: Sequence[int],
    boundaries: Sequence[int],
    budget: Budget,
    max_batch_size: int | None,
    seed: int,
    epoch: int,
) -> list[list[int]]:
    """Shuffle inside each bucket of ``boundaries``, pack greedily under the budget and
    ``max_batch_size``, and shuffle the batch list."""
    buckets: list[list[int]] = [[] for _ in range(len(boundaries) - 1)]
    for index, bucket in enumerate(bucket_of(lengths, boundaries)):
        buckets[bucket].append(index)
    rng = make_rng(seed, "buckets", epoch)
    batches: list[list[int]] = []
    for members in buckets:
        # A fresh in-bucket shuffle each epoch is what changes batch composition.
        rng.shuffle(members)
        batches += pack_in_order(members, lengths, budget, max_batch_size=max_batch_size)
    return shuffled(batches, seed, epoch)


def plan_oracle(
    lengths: Sequence[int], budget: Budget, max_batch_size: int | None, seed: int, epoch: int
) -> list[list[int]]:
    """Group the global longest-first sort under the budget (capped by
    ``max_batch_size``) and shuffle the batch order."""
    batches = group_lengths(list(lengths), budget, max_group_size=max_batch_size)
    return shuffled(batches, seed, epoch)


@dataclass(frozen=True, slots=True)
class PlanStats:
    """Padding statistics of one epoch plan.

    Attributes:
        steps: Non-empty batches.
        mean_batch_size: Samples per step.
        padding_efficiency: Real tokens / padded tokens (1.0 for padding-free rows).
        budget_fill: Mean padded tokens per step / ``token_budget``; above 1 when a mode
            that ignores the budget (``standard``, ``sorted``) overshoots it.
        over_budget_samples: Samples that alone cost more than the budget.
        over_budget_batches: Multi-sample batches that cost more than the budget.
        real_tokens: Sum of sample lengths.
        padded_tokens: Sum over batches of the layout's padded tokens (``size * longest``
            for padded rows).
    """

    steps: int
    mean_batch_size: float
    padding_efficiency: float
    budget_fill: float
    over_budget_samples: int
    over_budget_batches: int
    real_tokens: int
    padded_tokens: int


PADDED = PaddedRows()
"""The default layout of :func:`summarize_plan`: padded rows, no rounding, tokens only."""


def summarize_plan(
    lengths: Sequence[int],
    batches: Sequence[Sequence[int]],
    token_budget: int,
    *,
    rows: RowLayout = PADDED,
) -> PlanStats:
    """Padding statistics of ``batches`` (indices into ``lengths``) against the budget of
    the row layout ``rows`` (whose padded tokens they count).

    Empty (IDLE) batches are not steps and are skipped.
    """
    budget = rows.budget(token_budget)
    steps = samples = real = padded = over_samples = over_batches = 0
    for batch in batches:
        if not batch:
            continue
        batch_lengths = [lengths[i] for i in batch]
        steps += 1
        samples += len(batch)
        real += sum(batch_lengths)
        padded += rows.padded_tokens(batch_lengths)
        over_samples += sum(budget.is_over_budget(n) for n in batch_lengths)
        over_batches += len(batch) > 1 and budget.group_cost(batch_lengths) > token_budget
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
