"""The loader's process settings (``batching.loader``): workers, timeouts, pinning, the
start method and what a bad sample does. None of them changes which batches form."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from enum import StrEnum

from odb_lightning.core.checks import check_bool, check_int, check_positive, enum_member

LOADER_KEY = "batching.loader"
"""The Hydra key of the loader settings: every message names ``batching.loader.<field>``."""


class OnBadSample(StrEnum):
    """What a sample that fails validation does: stop naming it, or be skipped and counted."""

    RAISE = "raise"
    SKIP = "skip"


class StartMethod(StrEnum):
    """``multiprocessing`` start method of the loader's worker and collate processes."""

    FORK = "fork"
    SPAWN = "spawn"
    FORKSERVER = "forkserver"


@dataclass(frozen=True)
class LoaderConfig:
    """How the loader's processes run."""

    num_workers: int = 2
    """Loader worker processes per rank (0: everything in the main process, for debugging)."""
    on_bad_sample: OnBadSample = OnBadSample.RAISE
    """``raise``: stop with an error naming the sample and field; ``skip``: leave it out
    and count it."""
    timeout_s: float = 60.0
    """Most seconds without a sample arriving from the workers before the rank fails."""
    alignment_timeout_s: float = 60.0
    """Most seconds for connecting the metadata channel and for one round's all-gather
    (keep it >= ``timeout_s``: peers wait while a rank waits for a slow sample)."""
    persistent_workers: bool = True
    """Keep the loader processes (and the metadata channel) across epochs."""
    pin_memory: bool = True
    """Put every batch in page-locked host memory when CUDA is available (asynchronous
    host-to-device copies); ignored without CUDA."""
    multiprocessing_context: StartMethod | None = None
    """``fork``, ``spawn``, ``forkserver``, or ``None``: the platform's default."""

    def __post_init__(self) -> None:
        key = LOADER_KEY
        check_int(f"{key}.num_workers", self.num_workers, least=0)
        bad = enum_member(OnBadSample, f"{key}.on_bad_sample", self.on_bad_sample)
        object.__setattr__(self, "on_bad_sample", bad)
        check_positive(f"{key}.timeout_s", self.timeout_s, "seconds")
        check_positive(f"{key}.alignment_timeout_s", self.alignment_timeout_s, "seconds")
        check_bool(f"{key}.persistent_workers", self.persistent_workers)
        check_bool(f"{key}.pin_memory", self.pin_memory)
        if self.multiprocessing_context is not None:
            name = f"{key}.multiprocessing_context"
            method = enum_member(StartMethod, name, self.multiprocessing_context)
            if method.value not in multiprocessing.get_all_start_methods():
                raise ValueError(f"{name} {method.value!r} is not available here")
            object.__setattr__(self, "multiprocessing_context", method)
