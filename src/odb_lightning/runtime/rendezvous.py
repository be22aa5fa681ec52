"""Where the collate processes of all ranks meet to build their Gloo metadata channel.

Rank 0's main process hosts a dedicated ``TCPStore`` (free port) and tells the others its
address once, over the default process group, when the loader is built. Each channel
gets its own key prefix, so a restarted pipeline never reads a previous channel's keys.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Address of the metadata channel's ``TCPStore`` and this rank's place in it.

    Attributes:
        prefix: Key prefix shared by the ranks of one loader (unique per loader).
    """

    host: str
    port: int
    rank: int
    world_size: int
    prefix: str

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rendezvous rank must be in [0, world_size), got rank {self.rank} "
                f"and world_size {self.world_size}"
            )

    def channel_prefix(self, generation: int) -> str:
        """Store prefix of the ``generation``-th channel opened by this loader."""
        return f"odb/{self.prefix}/{generation}"

    def describe(self, generation: int) -> str:
        return f"{self.host}:{self.port}/{self.channel_prefix(generation)}"


def default_world() -> tuple[int, int]:
    """``(world_size, rank)`` of the initialized default process group, else ``(1, 0)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def host_rendezvous(world_size: int, rank: int) -> tuple[Rendezvous, dist.TCPStore | None]:
    """Start the store on rank 0 and share its address over the default group.

    A collective: every rank of the default group must call it. Returns the rendezvous
    and, on rank 0, the store, which must stay referenced while the channel is in use.
    """
    store = None
    payload: list[object] = [None]
    if rank == 0:
        host = socket.gethostname()
        store = dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False)
        payload = [(host, store.port, uuid.uuid4().hex)]
    dist.broadcast_object_list(payload, src=0)
    host, port, prefix = payload[0]
    return Rendezvous(host, port, rank, world_size, prefix), store
