"""The batching policies of the planned modes: each mode's knobs and its epoch plan.

A policy is the ``batching.policy`` node: its type is the mode (with the row layout,
:mod:`~odb_lightning.core.modes`), its fields are that mode's knobs and nothing else, and
code asks it what the mode needs (a length pass, a fixed batch size, its plan) instead of
testing the mode's name. The online policy is :mod:`~odb_lightning.core.online_policy`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from odb_lightning.core.buckets import bucket_table, optimize_boundaries
from odb_lightning.core.budget import Budget
from odb_lightning.core.checks import check_positive_int, is_int
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.plans import chunk, plan_bucketed, plan_oracle, shuffled

POLICY_KEY = "batching.policy"
"""The Hydra key of the policy: every message names ``batching.policy.<field>``."""


@dataclass(frozen=True)
class Policy:
    """What every policy answers; the subclasses add their mode's knobs."""

    online: ClassVar[bool] = False
    """Batches are formed at run time by the online runtime (no epoch plan up front)."""
    needs_length_pass: ClassVar[bool] = False
    """The plan needs every sample's exact length before the epoch (a length cache)."""
    fixed_size: ClassVar[bool] = False
    """Batches hold a fixed number of samples and ignore ``token_budget``."""

    @property
    def batch_cap(self) -> int | None:
        """Most samples one batch may hold (``None``: the budget alone decides)."""
        return None

    def fitted(self, lengths: Sequence[int], token_budget: int) -> tuple[Policy, list[str]]:
        """This policy made ready for an epoch of these exact lengths (a length pass's),
        and lines worth logging about it."""
        return self, []

    def plan_epoch(
        self, lengths: Sequence[int], budget: Budget, seed: int, epoch: int
    ) -> list[list[int]]:
        """One epoch's batches on one rank: indices into ``lengths``, each exactly once
        (the online policy's plan is the runtime's replay, ``core/planners.py``)."""
        raise NotImplementedError(f"{type(self).__name__} forms its batches online")


@dataclass(frozen=True)
class _FixedSizePolicy(Policy):
    batch_size: int = 8
    """Samples per batch."""

    fixed_size: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_positive_int(f"{POLICY_KEY}.batch_size", self.batch_size)


@dataclass(frozen=True)
class StandardPolicy(_FixedSizePolicy):
    """``standard``: ``batch_size`` samples in a fresh random order each epoch."""

    def plan_epoch(
        self, lengths: Sequence[int], budget: Budget, seed: int, epoch: int
    ) -> list[list[int]]:
        return chunk(epoch_permutation(len(lengths), seed, epoch), self.batch_size)


@dataclass(frozen=True)
class SortedPolicy(_FixedSizePolicy):
    """``sorted``: the global (length, index) sort cut into ``batch_size`` chunks, the
    batch order shuffled each epoch (the composition is static)."""

    needs_length_pass: ClassVar[bool] = True

    def plan_epoch(
        self, lengths: Sequence[int], budget: Budget, seed: int, epoch: int
    ) -> list[list[int]]:
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        return shuffled(chunk(order, self.batch_size), seed, epoch)


@dataclass(frozen=True)
class _BudgetedPolicy(Policy):
    max_batch_size: int | None = None
    """Cap on samples per batch; ``None``: the budget alone decides."""

    needs_length_pass: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_positive_int(f"{POLICY_KEY}.max_batch_size", self.max_batch_size, optional=True)

    @property
    def batch_cap(self) -> int | None:
        return self.max_batch_size


@dataclass(frozen=True)
class BucketedPolicy(_BudgetedPolicy):
    """``bucketed``: shuffle inside length buckets each epoch, pack greedily under the
    budget and ``max_batch_size``, shuffle the batch list."""

    max_batch_size: int | None = 64
    """Cap on samples per batch; ``None``: the budget alone decides."""
    boundaries: tuple[int, ...] = ()
    """Bucket edges; empty: optimized on the cached lengths (``num_buckets`` of them)."""
    num_buckets: int = 6
    """Buckets to optimize when ``boundaries`` is empty."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(f"{POLICY_KEY}.num_buckets", self.num_buckets)
        edges = tuple(self.boundaries)
        key = f"{POLICY_KEY}.boundaries"
        if not all(is_int(edge) and edge >= 0 for edge in edges):
            raise ValueError(f"{key} must be non-negative integers, got {list(edges)}")
        if any(b >= c for b, c in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"{key} must be strictly increasing, got {list(edges)}")
        object.__setattr__(self, "boundaries", edges)

    def fitted(self, lengths: Sequence[int], token_budget: int) -> tuple[Policy, list[str]]:
        """With edges optimized on the lengths when none are configured, and the bucket
        table (range, count, mean length, batch size, efficiency) to log."""
        # No cap (null) is a cap of the whole epoch to the optimizer's model.
        cap = self.max_batch_size or max(1, len(lengths))
        edges, how = list(self.boundaries), "configured"
        if not edges:
            started = time.perf_counter()
            edges = optimize_boundaries(
                lengths, self.num_buckets, token_budget=token_budget, max_batch_size=cap
            )
            how = f"optimized in {time.perf_counter() - started:.2f} s"
        rows = bucket_table(lengths, edges, token_budget=token_budget, max_batch_size=cap)
        lines = [
            f"bucket edges {edges} ({how})",
            f"{'range':>16} {'count':>8} {'mean len':>9} {'batch':>6} {'efficiency':>11}",
            *(
                f"{f'[{r.lo}, {r.hi})':>16} {r.count:8d} {r.mean_length:9.0f} "
                f"{r.batch_size:6d} {100 * r.efficiency:10.1f}%"
                for r in rows
            ),
        ]
        return replace(self, boundaries=tuple(edges)), lines

    def plan_epoch(
        self, lengths: Sequence[int], budget: Budget, seed: int, epoch: int
    ) -> list[list[int]]:
        if not self.boundaries:
            raise ValueError(f"{POLICY_KEY}.boundaries are required for mode 'bucketed'")
        return plan_bucketed(lengths, self.boundaries, budget, self.max_batch_size, seed, epoch)


@dataclass(frozen=True)
class OraclePolicy(_BudgetedPolicy):
    """``oracle``: the global longest-first sort grouped by ODB's rule on exact lengths,
    the batch order shuffled (the offline upper bound of token-budget batching)."""

    def plan_epoch(
        self, lengths: Sequence[int], budget: Budget, seed: int, epoch: int
    ) -> list[list[int]]:
        return plan_oracle(lengths, budget, self.max_batch_size, seed, epoch)
