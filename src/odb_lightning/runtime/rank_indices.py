"""Which dataset indices a rank's online loader walks each epoch: ``shard=``, ``order=``,
or the seeded default of the policy's dealing."""

from __future__ import annotations

from collections.abc import Callable

from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.order import epoch_permutation, shard_indices

ShardFn = Callable[[int], list[int]]
"""``shard(epoch)``: this rank's dataset indices for an epoch, in order."""


def given_indices(
    policy: OnlinePolicy, shard: ShardFn | None, order: ShardFn | None
) -> ShardFn | None:
    """The user's ``shard=`` or ``order=``, checked against the policy's dealing."""
    if shard is not None and policy.by_need:
        raise ValueError(
            "shard= gives every rank fixed indices, batching.policy.shard_dealing=by_need "
            "deals one global order: give order= (the epoch's order), or shard_dealing=fixed"
        )
    if order is not None and not policy.by_need:
        raise ValueError(
            "order= is the global order that batching.policy.shard_dealing=by_need deals; "
            "with shard_dealing=fixed give shard= (this rank's indices)"
        )
    return shard if shard is not None else order


def epoch_indices(
    given: ShardFn | None,
    policy: OnlinePolicy,
    num_samples: int,
    place: tuple[int, int],
    seed: int,
    epoch: int,
) -> list[int]:
    """This rank's shard for ``epoch`` (``place``: world size and rank); dealt by need,
    the epoch's global order."""
    if given is not None:
        return list(given(epoch))
    if policy.by_need:
        return epoch_permutation(num_samples, seed, epoch)
    world_size, rank = place
    return shard_indices(num_samples, world_size, rank, seed, epoch)
