"""The reference package's grouping (``online-dynamic-batching``) on the same shards.

Its real ``odb.grouping.grouping_data`` runs once per rank and round, in one thread per
rank; the one all-gather it issues per call (``dist.all_gather_into_tensor``) is served in
memory by :class:`ThreadGather`, which stands in for ``torch.distributed`` inside
``odb.grouping`` for the duration of :func:`measure_reference`. Around it, each thread runs
what the package's collate loop (``odb.collate.collate_loop_odb``) does with
``no_warmup=True`` and join mode: every ``buffer_size`` arrivals are one round with that
many output slots; the groups it returns are the round's steps, in the order its seeded
``random.Random(1042)`` shuffle gives them (the same on every rank); overflow samples go
back into the next round's buffer; a rank whose shard is exhausted reports finished until
every rank is. IDLE outputs are not steps (its iterator skips them), so a rank that emits
fewer groups in a round than another is IDLE at those step positions, costing 0.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import torch

from odb_lightning.core.budget import Budget
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.sync import sync_figures
from odb_lightning.core.types import Group, SampleInfo

SEED = 1042  # the package's default random_seed


class ThreadGather:
    """``get_world_size``, ``get_rank`` and ``all_gather_into_tensor`` for ``world`` threads."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._slots: list[torch.Tensor | None] = [None] * world
        self._barrier = threading.Barrier(world)

    def get_world_size(self, group: int) -> int:
        return self.world

    def get_rank(self, group: int) -> int:
        return group  # each thread passes its rank as its "group"

    def all_gather_into_tensor(self, out: torch.Tensor, local: torch.Tensor, group: int) -> None:
        self._slots[group] = local.clone()
        self._barrier.wait()
        out.copy_(torch.cat(self._slots))  # type: ignore[arg-type]
        self._barrier.wait()


_ONE_TOKEN = torch.zeros(1, dtype=torch.long)


def _samples(shard: list[int]) -> list[list[dict[str, Any]]]:
    """The shard as the package's collate loop receives it (one list per fetched index),
    built before the clock starts. ``input_ids`` is a stride-0 view of ``length`` tokens:
    the package reads only its size, so no sample's tokens are allocated."""
    return [
        [{"input_ids": _ONE_TOKEN.expand(length), "position": position}]
        for position, length in enumerate(shard)
    ]


def _rank_rounds(
    rank: int,
    shard: list[list[dict[str, Any]]],
    budget: int,
    buffer_size: int,
    rounds: list,
    errors: list,
) -> None:
    from odb import grouping

    try:
        shuffler = random.Random(SEED)
        data_buffer: list[list[dict]] = []
        taken, finished, num_grouped = 0, False, 0
        while True:
            take = shard[taken : taken + buffer_size]
            taken += len(take)
            finished = not take
            data_buffer += take
            num_grouped += sum(map(len, data_buffer)) if not finished else 0
            grouped, overflow, all_done, skipped = grouping.grouping_data(
                data_buffer,
                budget,
                rank,
                is_finished=finished,
                idx_budget=len(take),
                join_mode=True,
                max_groups=buffer_size,
                random_seed=SEED,
            )
            data_buffer = [[s] for s in overflow]
            if not skipped and not finished:
                shuffler.shuffle(grouped)
                rounds.append([[s["position"] for s in g] for g in grouped])
            else:
                rounds.append([])
            if all_done:
                rounds.append(("left", sum(map(len, data_buffer)), num_grouped))
                return
    except Exception as error:  # reported by the caller, which re-raises
        errors.append((rank, error))


def measure_reference(shards: list[list[int]], token_budget: int, buffer_size: int) -> dict:
    """One epoch of the reference's grouping over ``shards``, scored like ours."""
    from odb import grouping

    world = len(shards)
    per_rank: list[list] = [[] for _ in shards]
    errors: list = []
    real_dist = grouping.dist
    grouping.dist = ThreadGather(world)
    inputs = [_samples(shard) for shard in shards]
    threads = [
        threading.Thread(
            target=_rank_rounds,
            args=(rank, samples, token_budget, buffer_size, per_rank[rank], errors),
        )
        for rank, samples in enumerate(inputs)
    ]
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
    finally:
        grouping.dist = real_dist
    if errors:
        rank, error = errors[0]
        raise RuntimeError(f"the reference's grouping failed on rank {rank}") from error
    tails = [rounds.pop() for rounds in per_rank]
    left = [tail[1] for tail in tails]
    grouped = sum(tail[2] for tail in tails)
    steps: list[list[Group | None]] = [[] for _ in shards]
    for columns in zip(*per_rank, strict=True):
        width = max(map(len, columns))
        for rank, groups in enumerate(columns):
            shard = shards[rank]
            for position in range(width):
                if position < len(groups):
                    members = sorted(groups[position], key=lambda p: -shard[p])
                    steps[rank].append(Group(tuple(SampleInfo(p, shard[p], 0, p) for p in members)))
                else:
                    steps[rank].append(None)
    budget = Budget(token_budget)
    figures = sync_figures(steps, budget)
    everything = [n for shard in shards for n in shard]
    oracle = len(plan_epoch(everything, mode="oracle", token_budget=token_budget)) / world
    groups = [g for rank in steps for g in rank if g is not None]
    padded = sum(g.num_padded_tokens for g in groups)
    emitted = sum(g.size for g in groups)
    return {
        "world_size": world,
        "samples": len(everything),
        "token_budget": token_budget,
        "buffer_size": buffer_size,
        "rounds": len(per_rank[0]),
        "steps_per_rank": figures.steps,
        "oracle_steps_per_rank": oracle,
        "steps_vs_oracle": figures.steps / oracle,
        "utilization": figures.utilization,
        "sync_efficiency": figures.sync_efficiency,
        "idle_fraction": figures.idle_fraction,
        "padding_efficiency": sum(g.num_real_tokens for g in groups) / padded,
        "not_emitted": len(everything) - emitted,
        "left_in_buffers": sum(left),
        "grouped_per_step": grouped / (world * figures.steps),
        "groupings_per_sample": grouped / len(everything),
        "simulation_s": elapsed,
        "simulation_ms_per_step": 1e3 * elapsed / max(1, figures.steps),
        "planning_cpu_s": cpu_s,
    }
