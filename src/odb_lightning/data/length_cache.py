"""The on-disk length cache that the ``sorted``, ``bucketed`` and ``oracle`` modes need.

It holds the exact post-pipeline length of every sample, built by running the real
preprocessing (``dataset[i]``, in a ``DataLoader``) once, and is keyed by a fingerprint of
everything that changes lengths: source and version, record count, tokenizer, template,
``max_seq_len``, augmentation. Augmented datasets are refused: their lengths change every
epoch, so any cache would be stale from the second epoch on.

File format (:mod:`~odb_lightning.data.length_file`; one file per fingerprint,
``lengths-<fingerprint[:16]>.arrow``): an Arrow
IPC file of two ``int32`` columns, ``length`` and ``num_loss_tokens``, one row per sample
in dataset order, whose schema metadata holds a JSON header (format, fingerprint, parts,
count, build time). It is memory-mapped on load: the columns are numpy views of the file
(:attr:`CachedLengths.lengths`), so a million lengths cost no Python objects, and
``odb-plan --lengths`` reads the same file. A miss reads only the headers of the other
files to name what changed. Caches of the earlier JSON format are not read (the
fingerprint's format part changed), so they are rebuilt once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, Subset

from odb_lightning.core.signals import reset_inherited_handlers, signals_held
from odb_lightning.data.augment import Augmentation
from odb_lightning.data.length_file import (
    CACHE_FORMAT,
    CorruptCacheError,
    read_header,
    read_length_columns,
    write_length_file,
)
from odb_lightning.data.sources.source_records import source_version
from odb_lightning.sample import inspect_sample

logger = logging.getLogger(__name__)

_HEADERS_COMPARED = 16  # newest cache files whose headers a miss compares against
AUGMENTATION_REFUSED = (
    "augmentation changes lengths every epoch, so a length cache would be stale; use "
    "batching=odb (online) or disable augmentation"
)


def length_fingerprint(**parts: object) -> str:
    """SHA-256 hex digest of the canonical JSON of ``parts`` (JSON-serializable values)."""
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def source_parts(
    name: str,
    *,
    path: str | Path | None = None,
    regime: str | None = None,
    max_samples: int | None = None,
    seed: int | None = None,
    **layout: object,
) -> dict[str, object]:
    """The source's share of a length-cache key (arguments as given to ``load_source``;
    ``layout``: the record layout's ``format`` and ``mapping``, a mixture's ``parts``)."""
    return {
        "source": str(name),
        "source_version": source_version(str(name), path),
        "regime": None if regime is None else str(regime),
        "max_samples": max_samples,
        "source_seed": seed,
        **layout,
    }


@dataclass(frozen=True)
class CachedLengths:
    """Exact per-sample lengths of a dataset, from the cache or freshly built.

    Attributes:
        lengths: ``len(dataset[i]["input_ids"])`` for every index ``i`` (``int32``; on
            a hit a read-only view of the memory-mapped file).
        num_loss_tokens: Supervised positions per sample (shifted ``labels != -100``).
        fingerprint: The key the lengths are stored under.
        hit: Whether they were read from disk.
        build_s: Wall time of the length pass (0 on a hit).
        load_s: Wall time of reading the cache file (0 on a miss).
        path: The cache file.
    """

    lengths: np.ndarray
    num_loss_tokens: np.ndarray
    fingerprint: str
    hit: bool
    build_s: float
    load_s: float
    path: Path


class _SampleStats(Dataset[tuple[int, int]]):
    """``dataset[i]`` measured where it is produced, so workers send two ints, not tensors."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[int, int]:
        stats = inspect_sample(self.dataset[index], index, max_seq_len=None)
        return stats.length, stats.num_loss_tokens


def _augmentation_of(dataset: Dataset[Any]) -> Augmentation | None:
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return getattr(dataset, "augmentation", None)


def changed_parts(old: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """Names of the parts that differ (added, removed or changed), sorted."""
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def _read_cache(path: Path, fingerprint: str) -> tuple[np.ndarray, np.ndarray]:
    """The two columns of a cache file, checked against its header and ``fingerprint``."""
    header, lengths, num_loss_tokens = read_length_columns(path)
    if header.get("fingerprint") != fingerprint:
        raise CorruptCacheError(f"{path}: header does not match the fingerprint")
    return lengths, num_loss_tokens


def _newest_caches(directory: Path) -> list[Path]:
    """The most recently written cache files (at most ``_HEADERS_COMPARED``)."""
    stamped: list[tuple[int, Path]] = []
    for file in directory.glob("lengths-*.arrow"):
        try:
            stamped.append((file.stat().st_mtime_ns, file))
        except OSError:
            continue  # removed since the listing: nothing to compare against
    return [file for _, file in sorted(stamped, reverse=True)[:_HEADERS_COMPARED]]


def _measure(
    dataset: Dataset[Any], num_workers: int, progress: bool, context: str | None
) -> Iterator[tuple[int, int]]:
    from rich.console import Console
    from rich.progress import Progress

    loader = DataLoader(
        _SampleStats(dataset),
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context=context if num_workers > 0 else None,
        prefetch_factor=64 if num_workers > 0 else None,
        worker_init_fn=reset_inherited_handlers,  # no handler of this process runs there
    )
    with Progress(console=Console(stderr=True), transient=True, disable=not progress) as bar:
        task = bar.add_task("length cache", total=len(loader))
        with signals_held():  # the workers start; each resets its handlers first
            measured = iter(loader)
        for stats in measured:
            yield stats
            bar.advance(task)


def _describe(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else f"{text[:57]}..."


class LengthCache:
    """A directory of length caches, one file per fingerprint.

    Args:
        cache_dir: Where the files live (created on the first build).
    """

    def __init__(self, cache_dir: str | Path) -> None:
        self.cache_dir = Path(cache_dir)

    def path_for(self, fingerprint: str) -> Path:
        """The cache file of ``fingerprint``."""
        return self.cache_dir / f"lengths-{fingerprint[:16]}.arrow"

    def load_or_build(
        self,
        dataset: Dataset[Any],
        fingerprint: str,
        parts: Mapping[str, object],
        *,
        num_workers: int = 2,
        progress: bool = True,
        multiprocessing_context: str | None = None,
    ) -> CachedLengths:
        """The lengths of ``dataset``: read from the cache, or built and stored.

        Args:
            dataset: Map-style dataset of samples (a :class:`ChatDataset`, possibly inside
                a ``Subset``); its augmentation must be off.
            fingerprint: ``length_fingerprint(**parts)``.
            parts: What the fingerprint is made of; stored, so a miss names what changed.
            num_workers: Loader workers for the build (0 = in process).

        Raises:
            ValueError: The dataset's augmentation is enabled, or ``fingerprint`` is not
                the fingerprint of ``parts``.
        """
        augmentation = _augmentation_of(dataset)
        if augmentation is not None and augmentation.enabled:
            raise ValueError(AUGMENTATION_REFUSED)
        if fingerprint != length_fingerprint(**parts):
            raise ValueError("fingerprint must be length_fingerprint(**parts)")
        path = self.path_for(fingerprint)
        if path.exists():
            cached = self._load(path, fingerprint, len(dataset))  # type: ignore[arg-type]
            if cached is not None:
                return cached
            reason = "corrupt cache file"
        else:
            reason = self._miss_reason(parts)
        logger.info("length cache miss (%s) - building %d lengths", reason, len(dataset))
        return self._build(
            dataset, fingerprint, parts, num_workers, progress, multiprocessing_context
        )

    def _load(self, path: Path, fingerprint: str, num_samples: int) -> CachedLengths | None:
        start = time.perf_counter()
        try:
            lengths, num_loss_tokens = _read_cache(path, fingerprint)
            if len(lengths) != num_samples:
                raise CorruptCacheError(f"{path}: {len(lengths)} lengths for {num_samples} samples")
        except CorruptCacheError as error:
            logger.warning("length cache file is corrupt, rebuilding it: %s", error)
            return None
        load_s = time.perf_counter() - start
        hit = "length cache hit (%d lengths, fingerprint %s) in %.3f s: %s"
        logger.info(hit, num_samples, fingerprint[:16], load_s, path)
        return CachedLengths(lengths, num_loss_tokens, fingerprint, True, 0.0, load_s, path)

    def _miss_reason(self, parts: Mapping[str, object]) -> str:
        """Which parts differ from the closest cache in the directory (newest files first)."""
        best: list[str] | None = None
        best_parts: Mapping[str, object] = {}
        for file in _newest_caches(self.cache_dir):
            try:
                old = read_header(file)["parts"]
                changed = changed_parts(old, parts)
            except (ValueError, KeyError, AttributeError):  # CorruptCacheError is a ValueError
                continue  # an unreadable neighbour only makes the message less specific
            if best is None or len(changed) < len(best):
                best, best_parts = changed, old
        if best is None:
            return "no cache yet"
        if not best:
            return "no cache for this fingerprint"
        for key in best:
            old, new = _describe(best_parts.get(key)), _describe(parts.get(key))
            logger.info("length cache: %s changed: %s -> %s", key, old, new)
        return f"{', '.join(best)} changed"

    def _build(
        self,
        dataset: Dataset[Any],
        fingerprint: str,
        parts: Mapping[str, object],
        num_workers: int,
        progress: bool,
        context: str | None,
    ) -> CachedLengths:
        start = time.perf_counter()
        count = len(dataset)  # type: ignore[arg-type]
        lengths = np.empty(count, dtype=np.int32)
        num_loss_tokens = np.empty(count, dtype=np.int32)
        for index, (length, loss_tokens) in enumerate(
            _measure(dataset, num_workers, progress, context)
        ):
            lengths[index], num_loss_tokens[index] = length, loss_tokens
        build_s, path = time.perf_counter() - start, self.path_for(fingerprint)
        header = {"format": CACHE_FORMAT, "fingerprint": fingerprint, "parts": dict(parts)}
        header.update(num_samples=count, build_s=round(build_s, 3))
        try:  # a directory that cannot be written costs the cache, not the run
            write_length_file(self.cache_dir, path, header, lengths, num_loss_tokens)
        except OSError as error:
            logger.warning("length cache not stored (%s); the lengths are used uncached", error)
        done = "length cache built: %d lengths in %.2f s (%.0f samples/s, %d workers): %s"
        logger.info(done, count, build_s, count / max(build_s, 1e-9), num_workers, path)
        return CachedLengths(lengths, num_loss_tokens, fingerprint, False, build_s, 0.0, path)
