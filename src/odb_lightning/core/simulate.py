"""In-process multi-rank simulator.

Runs one :class:`~odb_lightning.core.window.GroupingWindow` per rank in lock step. Each
round every window reports, the reports go through the real wire encoding, the one
alignment function plans the round once (it is a pure function of the reports, so each
rank would compute the same plan), and every window acts on it. Samples arrive
instantly; the runtime waits for them instead, which changes timing but not the steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from odb_lightning.core.alignment import plan_round
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.online_policy import ShardDealing
from odb_lightning.core.pooling import PooledRound
from odb_lightning.core.sync import SyncFigures, sync_figures
from odb_lightning.core.types import SampleInfo
from odb_lightning.core.window import GroupingWindow, Step
from odb_lightning.core.wire import decode_report, encode_report


class SimulationStalled(RuntimeError):
    """The round loop ran past its proven bound: an alignment bug, never a data issue."""


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Everything a simulated epoch produced.

    Attributes:
        steps: Per rank, its steps in emission order.
        rounds: Alignment rounds run (including the final one that ends the epoch).
        dropped: Per rank, samples never emitted (non-join only).
        over_budget: Per rank, samples emitted alone because they exceed the budget.
        sync: Sync efficiency and utilization of the steps under the budget's cost model
            (:mod:`odb_lightning.core.sync`).
        grouped: Per rank, samples its window grouped over all rounds (each round groups
            the whole window): the planner's work.
        over_patch_budget: Per rank, samples emitted alone because their patches alone
            exceed ``max_patches``.
        first_step_samples: Per rank, samples that had arrived (or been skipped) when the
            first round emitted steps: what the first step waits for (the ramp's work).
        first_step_cost: Per rank, the row costs of those samples (each rounded up).
        moved_samples: Per rank, samples it ran that another rank's window held
            (``cross_rank_grouping``); ``moved_bytes`` their serialized bytes;
            ``moved_positions`` their positions (sample ids in a dealt epoch).
        fetch_us: With ``fetch_us`` per rank: the epoch's simulated time, each round as
            long as its slowest rank takes to fetch the samples it was dealt (one at a
            time; steps take no time).
        pool_plan_s: Per pooled round (``cross_rank_grouping``), the seconds
            :func:`~odb_lightning.core.pool_plan.plan_pool` took: what every rank spends
            planning that round in production (a timing, not part of the steps).
    """

    steps: list[list[Step]]
    rounds: int
    dropped: list[int]
    over_budget: list[int]
    sync: SyncFigures
    grouped: list[int]
    over_patch_budget: tuple[int, ...] = ()
    first_step_samples: tuple[int, ...] = ()
    first_step_cost: tuple[int, ...] = ()
    moved_samples: tuple[int, ...] = ()
    moved_bytes: tuple[int, ...] = ()
    fetch_us: int = 0
    pool_plan_s: tuple[float, ...] = ()
    moved_positions: tuple[tuple[int, ...], ...] = ()


def _fill(
    window: GroupingWindow,
    lengths: list[int],
    loss_tokens: list[int],
    patches: list[int] | None = None,
    patch_squares: list[int] | None = None,
    sample_bytes: list[int] | None = None,
) -> int:
    # Requests arrive at once; a window sized in work may ask again once they have.
    fetched = 0
    while positions := window.request():
        fetched += len(positions)
        for position in positions:
            window.add(
                SampleInfo(
                    sample_id=position,
                    length=lengths[position],
                    num_loss_tokens=loss_tokens[position],
                    position=position,
                    num_patches=0 if patches is None else patches[position],
                    patch_square_sum=0 if patch_squares is None else patch_squares[position],
                    num_bytes=0 if sample_bytes is None else sample_bytes[position],
                )
            )
    return fetched


def simulate_epoch(
    rank_lengths: list[list[int]],
    config: BatchingConfig,
    *,
    loss_tokens: list[list[int]] | None = None,
    epoch: int = 0,
    patches: list[list[int]] | None = None,
    patch_squares: list[list[int]] | None = None,
    sample_bytes: list[list[int]] | None = None,
) -> SimulationResult:
    """Simulate one epoch of fixed shards; sample ids are positions in each rank's list.
    ``rank_lengths`` are the shards, so the windows run with ``shard_dealing=fixed``
    whatever ``config`` says (:func:`simulate_dealt_epoch` deals one order by need), and
    without ``cross_rank_grouping`` (it needs one dealt order).
    ``patches`` (and ``patch_squares``): per rank, each sample's ViT patches (and its
    images' squared patch counts summed), for ``batching.rows.max_patches``; ``sample_bytes``:
    per rank, each sample's serialized size, for ``batching.policy.window_max_mib``."""
    config = BatchingConfig.of(config, shard_dealing=ShardDealing.FIXED, cross_rank_grouping=False)
    losses = loss_tokens if loss_tokens is not None else rank_lengths
    if len(losses) != len(rank_lengths):
        raise ValueError("loss_tokens must have one list per rank")
    windows = [
        GroupingWindow(config, len(lengths), rank=rank, epoch=epoch)
        for rank, lengths in enumerate(rank_lengths)
    ]
    if patches is not None and [len(p) for p in patches] != [len(n) for n in rank_lengths]:
        raise ValueError("patches must have one count per sample of every rank")
    return _run(
        windows,
        rank_lengths,
        losses,
        config,
        sum(map(len, rank_lengths)),
        patches=patches,
        patch_squares=patch_squares,
        sample_bytes=sample_bytes,
    )


def simulate_dealt_epoch(
    lengths: list[int],
    world_size: int,
    config: BatchingConfig,
    *,
    loss_tokens: list[int] | None = None,
    epoch: int = 0,
    sample_bytes: list[int] | None = None,
    fetch_us: list[int] | None = None,
) -> SimulationResult:
    """Simulate one epoch dealt by need from one global order (``lengths`` in that
    order, as the loader's seeded epoch order gives them); sample ids are positions in it.
    ``sample_bytes``: each sample's serialized size, for ``batching.policy.window_max_mib``.
    ``fetch_us``: per rank, microseconds to fetch one sample; the windows then report
    their waits (``fetch_aware_dealing`` reads them) and the result its ``fetch_us``."""
    if not config.policy.by_need:
        raise ValueError("simulate_dealt_epoch needs shard_dealing=by_need")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    losses = loss_tokens if loss_tokens is not None else lengths
    if len(losses) != len(lengths):
        raise ValueError("loss_tokens must have one entry per sample")
    windows = [GroupingWindow(config, len(lengths), rank=r, epoch=epoch) for r in range(world_size)]
    per_rank = None if sample_bytes is None else [sample_bytes] * world_size
    if fetch_us is not None and len(fetch_us) != world_size:
        raise ValueError("fetch_us must have one entry per rank")
    return _run(
        windows,
        [lengths] * world_size,
        [losses] * world_size,
        config,
        len(lengths),
        sample_bytes=per_rank,
        fetch_us=fetch_us,
    )


def _run(
    windows: list[GroupingWindow],
    rank_lengths: list[list[int]],
    losses: list[list[int]],
    config: BatchingConfig,
    num_samples: int,
    *,
    patches: list[list[int]] | None = None,
    patch_squares: list[list[int]] | None = None,
    sample_bytes: list[list[int]] | None = None,
    fetch_us: list[int] | None = None,
) -> SimulationResult:
    steps: list[list[Step]] = [[] for _ in windows]
    clock = 0  # simulated microseconds (fetch_us)
    pool_plan_s: list[float] = []
    max_steps = config.policy.max_steps_per_round
    # Every emitting round takes >= 1 sample from some rank, every round that only deals
    # deals >= 1 sample; one more round ends the epoch.
    bound = 2 * num_samples + 2
    first: list[tuple[int, int]] = []  # (samples, cost) received before the first step
    moved: list[list[int]] = [[] for _ in windows]
    for rounds in range(1, bound + 1):
        longest = 0
        for rank, (window, lengths, loss) in enumerate(
            zip(windows, rank_lengths, losses, strict=True)
        ):
            rank_patches = None if patches is None else patches[rank]
            squares = None if patch_squares is None else patch_squares[rank]
            sizes = None if sample_bytes is None else sample_bytes[rank]
            fetched = _fill(window, lengths, loss, rank_patches, squares, sizes)
            if fetch_us is not None:
                window.wait_us += fetched * fetch_us[rank]
                longest = max(longest, fetched * fetch_us[rank])
        if fetch_us is not None:
            clock += longest
            for window in windows:
                window.elapsed_us = clock
        messages = [encode_report(w.make_report(), max_steps) for w in windows]
        reports = [decode_report(m, max_steps) for m in messages]
        plan = plan_round(
            reports, join=config.policy.join, fetch_aware=config.policy.deals_by_fetch_time
        )
        if plan.target_steps and not first:
            first = [(w.num_received, w.received_cost) for w in windows]
        pool = PooledRound.of(reports, plan, config)
        if pool is not None:
            started = time.perf_counter()
            pool_plan = pool.plan([w.pool_offer() for w in windows])
            pool_plan_s.append(time.perf_counter() - started)
            outcomes = [w.apply_pool(pool, pool_plan) for w in windows]
        else:
            outcomes = [w.apply(plan) for w in windows]
        for outcome, rank_steps, rank_moved in zip(outcomes, steps, moved, strict=True):
            rank_steps.extend(outcome.steps)
            rank_moved.extend(outcome.moved_in)
        if plan.epoch_over:
            return SimulationResult(
                steps=steps,
                rounds=rounds,
                dropped=[w.num_dropped for w in windows],
                over_budget=[w.num_over_budget for w in windows],
                grouped=[w.num_grouped for w in windows],
                over_patch_budget=tuple(w.num_over_patch_budget for w in windows),
                first_step_samples=tuple(n for n, _ in first),
                first_step_cost=tuple(c for _, c in first),
                moved_samples=tuple(w.num_moved_in for w in windows),
                moved_bytes=tuple(w.moved_in_bytes for w in windows),
                fetch_us=clock,
                pool_plan_s=tuple(pool_plan_s),
                moved_positions=tuple(map(tuple, moved)),
                sync=sync_figures([[s.group for s in rank] for rank in steps], config.budget),
            )
    raise SimulationStalled(f"no end of epoch after {bound} rounds")


def simulate(
    rank_lengths: list[list[int]],
    config: BatchingConfig | None = None,
    *,
    loss_tokens: list[list[int]] | None = None,
    epoch: int = 0,
    patches: list[list[int]] | None = None,
    **knobs: object,
) -> list[list[list[int]]]:
    """Steps every rank emits for one epoch, in order.

    Args:
        rank_lengths: Per rank, the token lengths of its fixed shard in arrival order.
        config: The batching settings (the row layout sets what a group costs).
        loss_tokens: Per rank, supervised tokens per sample (default: the lengths).
        epoch: Epoch number (changes the step order).
        patches: Per rank, ViT patches per sample (for ``max_patches``; default none).
        **knobs: Settings by their field names that replace those of ``config``
            (:meth:`~odb_lightning.core.config.BatchingConfig.of`).

    Returns:
        For each rank its steps in order; each step the indices into that rank's list it
        emits, ``[]`` for an IDLE step. Every rank has the same number of steps.
    """
    resolved = BatchingConfig.of(config, **knobs)
    result = simulate_epoch(
        rank_lengths, resolved, loss_tokens=loss_tokens, epoch=epoch, patches=patches
    )
    return [
        [[] if s.group is None else [m.sample_id for m in s.group.samples] for s in rank_steps]
        for rank_steps in result.steps
    ]
