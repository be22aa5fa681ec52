"""Per-epoch loader statistics (``ODBLoader.last_epoch_stats``)."""

from __future__ import annotations

from dataclasses import dataclass

from odb_lightning.sample import TRUNCATED_FROM, is_truncated

__all__ = ["TRUNCATED_FROM", "EpochStats", "is_truncated"]


@dataclass(frozen=True, slots=True)
class EpochStats:
    """What one rank's loader did in one epoch.

    Attributes:
        epoch: Epoch number.
        emitted_samples: Samples emitted in real (non-IDLE) steps.
        steps: Batches yielded, IDLE ones included (equal on every rank).
        idle_steps: IDLE batches among them.
        dropped: Shard samples never emitted (non-join end of epoch).
        skipped_ids: Dataset indices skipped as bad samples (``on_bad_sample="skip"``).
        over_budget: Samples emitted alone because they exceed the token budget.
        rounds: Alignment rounds, including the one that ended the epoch.
        round_latency_s: Per round, seconds from publishing the report to holding the
            plan (the all-gather, including waiting for the slowest rank).
        window_fill_s: Seconds from the epoch start until the first window was ready.
        loader_wait_s: Seconds the main process spent waiting for batches.
        unsupervised: Samples fetched this epoch with no supervised token
            (``num_loss_tokens == 0``); ``None`` where the loader does not count them.
        truncated: Samples fetched this epoch that their dataset cut to ``max_seq_len``
            (:func:`is_truncated`); ``None`` where the loader does not count them.
        image_tokens: Tokens standing for images in the emitted samples.
        image_patches: ViT patches of the emitted samples' images.
        over_patch_budget: Samples emitted alone because their patches alone exceed
            ``batching.rows.max_patches``.
        moved_samples: Samples this rank ran that another rank fetched
            (``cross_rank_grouping``); ``moved_bytes`` the bytes they crossed the channel
            in (compressed, :func:`~odb_lightning.runtime.transport.pack_moved`).
        fetched_samples: Samples this rank's workers fetched this epoch (skipped ones
            not counted); with moves, not the samples it ran.
    """

    epoch: int
    emitted_samples: int
    steps: int
    idle_steps: int
    dropped: int
    skipped_ids: tuple[int, ...]
    over_budget: int
    rounds: int
    round_latency_s: tuple[float, ...]
    window_fill_s: float
    loader_wait_s: float = 0.0
    unsupervised: int | None = None
    truncated: int | None = None
    image_tokens: int = 0
    image_patches: int = 0
    over_patch_budget: int = 0
    moved_samples: int = 0
    moved_bytes: int = 0
    fetched_samples: int = 0
