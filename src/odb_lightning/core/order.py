"""Seeded orders: every random choice in the core and runtime derives from here, so a
fixed ``seed`` gives the same plan in the simulator and in production."""

from __future__ import annotations

import random
from collections.abc import Sequence


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


def emission_order(
    num_steps: int,
    rng: random.Random,
    *,
    paired: bool,
    lengths: Sequence[float] | None = None,
) -> list[int]:
    """The order in which a round's step positions are emitted: a permutation drawn from
    ``rng``, which every rank seeds alike, so position ``t`` stays aligned across ranks.

    ``paired=False``: a uniform permutation. ``paired=True``: the positions ranked by
    ``lengths`` (a per-position length every rank knows alike, longest first, ties by
    position; default: the position itself), and the longest paired with the shortest,
    the second longest with the second shortest, ...; the pairs are emitted in a uniform
    order, each pair's two steps back to back in a random order of the two (an odd count
    leaves the median alone). Either way no length curriculum runs through the round;
    paired, consecutive steps also hold long and short samples, so micro-batches
    accumulated into one optimizer step cover the length range.
    """
    positions = list(range(num_steps))
    if not paired:
        rng.shuffle(positions)
        return positions
    if lengths is not None:
        if len(lengths) != num_steps:
            raise ValueError(f"{len(lengths)} lengths for {num_steps} positions")
        positions.sort(key=lambda i: (-lengths[i], i))
    half, odd = divmod(num_steps, 2)
    units = [[positions[i], positions[num_steps - 1 - i]] for i in range(half)]
    if odd:
        units.append([positions[half]])
    rng.shuffle(units)
    for unit in units:
        if len(unit) == 2 and rng.random() < 0.5:
            unit.reverse()
    return [position for unit in units for position in unit]
