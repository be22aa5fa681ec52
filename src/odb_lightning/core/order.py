"""Seeded orders: every random choice in the core and runtime derives from here, so a
fixed ``seed`` gives the same plan in the simulator and in production."""

from __future__ import annotations

import random


def make_rng(seed: int, *salt: int | str) -> random.Random:
    """A private RNG for ``(seed, *salt)``, e.g. ``make_rng(seed, "shard", epoch)``."""
    return random.Random(":".join(str(part) for part in (seed, *salt)))


def epoch_permutation(n: int, seed: int, epoch: int) -> list[int]:
    """A permutation of ``range(n)`` that changes with the epoch."""
    order = list(range(n))
    make_rng(seed, "epoch", epoch).shuffle(order)
    return order


def shard_indices(n: int, world_size: int, rank: int, seed: int, epoch: int) -> list[int]:
    """This rank's dataset indices for an epoch: a seeded global shuffle, then every
    ``world_size``-th index. Shards differ in size by at most one; nothing is duplicated
    or padded, so every index belongs to exactly one rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return epoch_permutation(n, seed, epoch)[rank::world_size]
