"""Typed messages between the main, collate and worker processes (no sentinel values).

Flow: main -> collate (:class:`EpochStart`, :class:`Shutdown`); collate -> worker
(:class:`FetchRequest`, :class:`StopWorker` from main at close); worker -> collate
(:class:`FetchedSample`, :class:`SampleSkipped`, :class:`SampleFailed`); collate -> main
(``ODBBatch``, :class:`EpochEnd`, :class:`CollateFailed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from odb_lightning.runtime.stats import EpochStats


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Fetch ``dataset[dataset_index]``, the sample at ``position`` in this rank's shard,
    for ``epoch`` (a dataset with ``set_epoch``, e.g. one that augments, is told first).
    A streamed record travels as ``record``: the worker tokenizes it
    (``dataset.tokenize_record(record, dataset_index)``) instead of reading the dataset."""

    position: int
    dataset_index: int
    epoch: int = 0
    record: Any = None


@dataclass(frozen=True, slots=True)
class StopWorker:
    """The worker exits its loop."""


@dataclass(frozen=True, slots=True)
class FetchedSample:
    """A validated sample, serialized (see :mod:`~odb_lightning.runtime.transport`)."""

    position: int
    dataset_index: int
    length: int
    num_loss_tokens: int
    payload: bytes
    truncated: bool = False  # its dataset cut it to max_seq_len
    num_patches: int = 0  # ViT patches of its images (count_image_patches)
    num_image_tokens: int = 0  # of length, the tokens that stand for images
    patch_square_sum: int = 0  # sum of p**2 over its images (count_patch_squares)


@dataclass(frozen=True, slots=True)
class SampleSkipped:
    """A bad sample skipped under ``on_bad_sample="skip"``; ``reason`` says why."""

    position: int
    dataset_index: int
    reason: str


@dataclass(frozen=True, slots=True)
class SampleFailed:
    """``dataset[i]`` raised (``bad_sample=False``) or the sample is invalid."""

    position: int
    dataset_index: int
    bad_sample: bool
    message: str
    traceback: str
    field: str = ""  # for bad samples: which field, and what is wrong with it
    problem: str = ""


FetchResult = FetchedSample | SampleSkipped | SampleFailed


@dataclass(frozen=True, slots=True)
class EpochStart:
    """Run one epoch over ``indices`` (this rank's dataset indices, in shard order)."""

    epoch: int
    indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The collate process closes its channel and exits."""


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """The epoch is over on every rank; no more batches follow for it."""

    stats: EpochStats


@dataclass(frozen=True, slots=True)
class CollateFailed:
    """The collate process failed; the main process raises ``error``.

    Attributes:
        error: The exception (a picklable runtime/core error, or a ``RuntimeError``
            carrying the text of one that does not pickle).
        traceback: Its formatted traceback in the collate process.
    """

    error: Exception
    traceback: str
