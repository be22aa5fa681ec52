"""The typed ``batching`` config group: which mode forms batches, and its knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from odb_lightning.core.plan import BatchingMode


@dataclass(frozen=True)
class BatchingConfig:
    """How batches are formed (SPEC section 2). YAML keys equal these field names.

    Attributes:
        mode: ``standard``, ``sorted``, ``bucketed``, ``oracle``, ``odb`` or ``odb_packed``.
        token_budget: ``L_max``: most padded tokens per step (real tokens when packed).
        outstanding_depth: ODB window ``D``: samples in flight per rank.
        max_steps_per_round: Most steps one alignment round emits per rank.
        join: Join mode (every sample once per epoch) or non-join (shortest-rank closure).
        batch_size: Fixed batch size of ``standard`` and ``sorted``.
        max_batch_size: Cap on samples per batch in ``bucketed`` and ``oracle``.
        boundaries: Bucket edges for ``bucketed``; empty = optimized on cached lengths.
        num_buckets: Buckets to optimize when ``boundaries`` is empty.
        attention_weight: Quadratic attention term of the budget.
        on_bad_sample: ``raise`` (error naming the sample and field) or ``skip`` (count it).
        timeout_s: Bound on waiting for a worker or the collate process.
        alignment_timeout_s: Bound on one metadata exchange between ranks.
        persistent_workers: Keep loader processes alive across epochs.
        multiprocessing_context: ``fork``, ``spawn``, ``forkserver`` or null (default).
    """

    mode: BatchingMode = BatchingMode.ODB
    token_budget: int = 16384
    outstanding_depth: int = 256
    max_steps_per_round: int = 8
    join: bool = True
    batch_size: int = 8
    max_batch_size: int | None = None
    boundaries: list[int] = field(default_factory=list)
    num_buckets: int = 6
    attention_weight: float = 0.0
    on_bad_sample: str = "raise"
    timeout_s: float = 60.0
    alignment_timeout_s: float = 60.0
    persistent_workers: bool = True
    multiprocessing_context: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", BatchingMode(self.mode))
        except ValueError:
            choices = ", ".join(m.value for m in BatchingMode)
            raise ValueError(f"mode must be one of {choices}, got {self.mode!r}") from None
        object.__setattr__(self, "boundaries", [int(b) for b in self.boundaries])
        for name in ("token_budget", "outstanding_depth", "max_steps_per_round", "batch_size"):
            _check_positive_int(name, getattr(self, name))
        _check_positive_int("num_buckets", self.num_buckets)
        if self.max_batch_size is not None:
            _check_positive_int("max_batch_size", self.max_batch_size)
        for name in ("timeout_s", "alignment_timeout_s"):
            value = getattr(self, name)
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (is_number and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.on_bad_sample not in ("raise", "skip"):
            raise ValueError(f"on_bad_sample must be 'raise' or 'skip', got {self.on_bad_sample!r}")
        if self.multiprocessing_context not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(
                "multiprocessing_context must be fork, spawn, forkserver or null, "
                f"got {self.multiprocessing_context!r}"
            )
        if any(b >= c for b, c in zip(self.boundaries, self.boundaries[1:], strict=False)):
            raise ValueError(f"boundaries must be strictly increasing, got {self.boundaries}")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
