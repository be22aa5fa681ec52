"""Real ShareGPT lengths dealt to W ranks, and one epoch of them simulated against the oracle.

Shared by the scale study (``run.py`` here) and the ablation (``experiments/ablation``).

* Lengths: ShareGPT V3 whole conversations after the Qwen2.5 ChatML template, at most
  4,096 tokens (``odb_lightning.data.lengths.source_lengths``, the planner's source): 17,483
  conversations, mean 1,456, CV 0.54.
* Shards: ``world x per_rank`` lengths, drawn without replacement from the real ones when
  there are enough (a seeded sample), else with replacement (a seeded bootstrap of the
  empirical distribution, e.g. 64 ranks x 2,185); then dealt as production deals them
  (``core.order.shard_indices``: a seeded shuffle, every ``world``-th index).
* Oracle: global longest-first packing of all lengths under the budget
  (``plan_epoch(..., mode="oracle")``), its steps divided by ``world``: what one rank holding
  every length would need, the floor for any aligned schedule.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.simulate import simulate_epoch

MAX_SEQ_LEN = 4096


def sharegpt_lengths() -> list[int]:
    """Token lengths of ShareGPT whole conversations (at most 4,096 tokens)."""
    from odb_lightning.data.lengths import source_lengths

    return source_lengths("sharegpt", max_seq_len=MAX_SEQ_LEN)


def draw_lengths(real: list[int], count: int, seed: int) -> tuple[list[int], bool]:
    """``count`` lengths from ``real``: a sample without replacement when ``count`` fits,
    else a bootstrap. Returns the lengths and whether they were resampled."""
    rng = random.Random(f"shards:{seed}:{count}")
    if count <= len(real):
        return rng.sample(real, count), False
    return rng.choices(real, k=count), True


def deal(lengths: list[int], world: int, seed: int = 0) -> list[list[int]]:
    """Each rank's lengths in arrival order, dealt as the loader's default shard
    (``shard_indices``: one seeded permutation, every ``world``-th index; the permutation
    is drawn once here rather than once per rank)."""
    order = epoch_permutation(len(lengths), seed, 0)
    return [[lengths[i] for i in order[rank::world]] for rank in range(world)]


@dataclass(frozen=True)
class EpochFigures:
    """One simulated epoch against the oracle."""

    world_size: int
    samples_per_rank: int
    outstanding_depth: int
    token_budget: int
    resampled: bool
    rounds: int
    steps_per_rank: int
    oracle_steps_per_rank: float
    steps_vs_oracle: float
    idle_steps: int
    padding_efficiency: float
    budget_fill: float
    simulation_s: float


def study_config(token_budget: int, depth: int) -> BatchingConfig:
    """The studies' settings: a window of ``depth`` samples, 8 steps a round."""
    return BatchingConfig.of(
        token_budget=token_budget,
        outstanding_depth=depth,
        window_budgets=None,
        max_steps_per_round=8,
    )


def oracle_steps_per_rank(lengths: list[int], world: int, token_budget: int) -> float:
    return len(plan_epoch(lengths, mode="oracle", token_budget=token_budget)) / world


def simulate_figures(
    lengths: list[int],
    world: int,
    depth: int,
    token_budget: int,
    *,
    resampled: bool = False,
    oracle: float | None = None,
) -> EpochFigures:
    """Simulate one epoch of ``lengths`` dealt over ``world`` ranks with window ``depth``."""
    shards = deal(lengths, world)
    config = study_config(token_budget, depth)
    started = time.perf_counter()
    result = simulate_epoch(shards, config)
    elapsed = time.perf_counter() - started
    groups = [s.group for rank in result.steps for s in rank if s.group is not None]
    padded = sum(g.num_padded_tokens for g in groups)
    steps = len(result.steps[0])
    if oracle is None:
        oracle = oracle_steps_per_rank(lengths, world, token_budget)
    return EpochFigures(
        world_size=world,
        samples_per_rank=len(lengths) // world,
        outstanding_depth=depth,
        token_budget=token_budget,
        resampled=resampled,
        rounds=result.rounds,
        steps_per_rank=steps,
        oracle_steps_per_rank=oracle,
        steps_vs_oracle=steps / oracle,
        idle_steps=sum(len(rank) for rank in result.steps) - len(groups),
        padding_efficiency=sum(lengths) / padded,
        budget_fill=padded / (world * steps * token_budget),
        simulation_s=elapsed,
    )
