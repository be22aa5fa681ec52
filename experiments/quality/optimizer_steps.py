"""The optimizer steps each arm of the quality study takes, predicted before training.

Both loaders replay exactly: ``standard`` is ``plan_epoch(..., mode="standard")`` over the
training positions, and ``odb`` is the simulator over the loader's shard order. So every
arm's optimizer steps (which samples, how many supervised tokens) and its learning rate
at each step are known from the data alone. That is what picks ``tokens_per_step`` and
what describes how the arms differ at equal tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from odb_lightning.core.loss_weights import token_target_boundaries
from odb_lightning.core.order import shard_indices
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.simulate import simulate
from odb_lightning.lit.model.lr_schedule import LRSchedule, lr_factor
from odb_lightning.sample import inspect_sample


@dataclass
class EpochBatches:
    """Per epoch, each micro-batch as the dataset indices it holds."""

    standard: list[list[list[int]]]
    odb: list[list[list[int]]]
    lengths: dict[int, int]
    loss_tokens: dict[int, int]


def predict_batches(
    cfg: Any,
    datamodule: Any,
    batching: Any,
    epochs: int,
    *,
    fixed_mode: str = "standard",
    batch_size: int = 8,
) -> EpochBatches:
    """Every epoch's micro-batches of a fixed-size mode (``fixed_mode``: ``standard`` or
    ``sorted``, ``batch_size`` samples; in ``standard``) and, if ``batching`` is an online
    mode, of ``odb`` on this data (else ``odb`` is empty)."""
    train = datamodule.train_indices
    stats = {i: inspect_sample(datamodule.dataset[i], i, cfg.data.sizes.max_seq_len) for i in train}
    lengths = [stats[i].length for i in train]
    standard, odb = [], []
    for epoch in range(epochs):
        plan = plan_epoch(lengths, batching, mode=fixed_mode, batch_size=batch_size, epoch=epoch)
        standard.append([[train[p] for p in batch] for batch in plan])
        if not batching.policy.online:
            continue
        order = [train[p] for p in shard_indices(len(train), 1, 0, batching.seed, epoch)]
        (steps,) = simulate(
            [[stats[i].length for i in order]],
            batching,
            loss_tokens=[[stats[i].num_loss_tokens for i in order]],
            epoch=epoch,
        )
        odb.append([[order[p] for p in step] for step in steps])
    return EpochBatches(
        standard,
        odb,
        {i: s.length for i, s in stats.items()},
        {i: s.num_loss_tokens for i, s in stats.items()},
    )


def token_target_steps(batches: EpochBatches, tokens_per_step: int) -> list[list[list[int]]]:
    """Per epoch, the odb micro-batches merged into token-target optimizer steps."""
    merged = []
    for epoch in batches.odb:
        counts = [sum(batches.loss_tokens[i] for i in batch) for batch in epoch]
        steps, start = [], 0
        for end in token_target_boundaries(counts, tokens_per_step):
            steps.append([i for batch in epoch[start : end + 1] for i in batch])
            start = end + 1
        merged.append(steps)
    return merged


def choose_tokens_per_step(batches: EpochBatches, candidates: Iterable[int] | None = None) -> int:
    """The smallest ``N`` (of ``candidates``; default: 64 up to four times the mean tokens of
    standard's steps, by 16) whose token-target steps come closest to standard's step
    count."""
    target = sum(len(epoch) for epoch in batches.standard)
    tokens = sum(batches.loss_tokens.values()) * len(batches.standard)

    def steps_for(n: int) -> int:
        return sum(len(epoch) for epoch in token_target_steps(batches, n))

    if candidates is None:
        candidates = range(64, 4 * tokens // target, 16)
    return min(candidates, key=lambda n: (abs(steps_for(n) - target), n))


def step_statistics(
    batches: EpochBatches, epoch_steps: list[list[list[int]]], by_samples: bool, model: Any
) -> dict[str, float]:
    """How an arm's optimizer steps look: count, supervised tokens and samples per step
    (mean, CV), the spread of lengths inside a step, and the learning rate a supervised
    token sees on average (the cosine by step for ``standard``, by samples seen for odb)."""
    steps = [step for epoch in epoch_steps for step in epoch]
    tokens = [sum(batches.loss_tokens[i] for i in step) for step in steps]
    sizes = [len(step) for step in steps]
    planned = sum(sizes)
    seen, factors = 0, []
    for index, size in enumerate(sizes):
        progress = seen / planned if by_samples else None
        factors.append(
            lr_factor(index, model.scheduler.warmup_steps, len(steps),
                      model.scheduler.min_lr_ratio, LRSchedule(model.scheduler.shape), progress)
        )  # fmt: skip
        seen += size

    def cv(values: list[float]) -> float:
        return statistics.pstdev(values) / statistics.fmean(values)

    spreads = [cv([batches.lengths[i] for i in step]) for step in steps if len(step) > 1]
    return {
        "optimizer_steps": len(steps),
        "tokens_per_step_mean": statistics.fmean(tokens),
        "tokens_per_step_cv": cv(tokens),
        "samples_per_step_mean": statistics.fmean(sizes),
        "samples_per_step_cv": cv(sizes),
        "length_cv_within_step_mean": statistics.fmean(spreads),
        "token_weighted_lr_factor": sum(f * t for f, t in zip(factors, tokens, strict=True))
        / sum(tokens),
        "lr_factor_sum": sum(factors),
    }
