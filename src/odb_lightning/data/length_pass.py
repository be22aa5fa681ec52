"""The length pass of the length-pass modes: every training sample's exact length and
supervised tokens, from the length cache (built once by rank 0 while the others wait)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from odb_lightning.data.length_cache import LengthCache, length_fingerprint, source_parts
from odb_lightning.data.synthetic import SyntheticDataset


@dataclass(frozen=True)
class ExactLengths:
    """Per dataset index: length and supervised tokens (``int32`` columns, on a cache hit
    memory-mapped from the cache file); ``build_s`` is the time the length pass cost this
    run (0 on a cache hit, ``None`` without a cache)."""

    lengths: np.ndarray
    num_loss_tokens: np.ndarray
    build_s: float | None


def exact_lengths(
    dataset: Any,
    source: dict[str, Any],
    cache_dir: str | None,
    *,
    num_workers: int,
    multiprocessing_context: str | None,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] | None = None,
) -> ExactLengths:
    """The exact lengths of ``dataset``.

    Args:
        dataset: A :class:`~odb_lightning.data.ChatDataset` or a ``SyntheticDataset``
            (measured directly: it has no tokenizer to cache against).
        source: The ``load_source`` arguments of the records (``name``, ``path``,
            ``regime``, ``max_samples``, ``seed``): part of the cache key.
        cache_dir: Where the length caches live; required for a ``ChatDataset``.
        num_workers: Worker processes of a cache build (0: in process);
            ``multiprocessing_context`` is their start method.
        rank: This rank; rank 0 builds a missing cache.
        barrier: Waits for every rank; with ``world_size > 1`` each rank calls it once,
            rank 0 after its build and the others before they read.
    """
    if isinstance(dataset, SyntheticDataset):  # its lengths are its definition: no samples built
        lengths = np.asarray(dataset.lengths, dtype=np.int32)
        loss_tokens = np.array(
            [dataset.num_loss_tokens(i) for i in range(len(dataset))], dtype=np.int32
        )
        return ExactLengths(lengths, loss_tokens, None)
    if cache_dir is None:
        raise ValueError("length-pass modes need data.caches.length_dir")
    parts = {**source_parts(**source), **dataset.length_settings()}
    distributed = world_size > 1 and barrier is not None
    if distributed and rank != 0:
        barrier()
    cached = LengthCache(cache_dir).load_or_build(
        dataset,
        length_fingerprint(**parts),
        parts,
        num_workers=num_workers,
        multiprocessing_context=multiprocessing_context,
    )
    if distributed and rank == 0:
        barrier()
    return ExactLengths(cached.lengths, cached.num_loss_tokens, cached.build_s)
