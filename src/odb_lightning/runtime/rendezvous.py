"""Where the collate processes of all ranks meet to build their Gloo metadata channel.

Rank 0's main process hosts a dedicated ``TCPStore`` (free port) and tells the others its
address once, over the default process group, when the loader is built. Each channel
gets its own key prefix, so a restarted pipeline never reads a previous channel's keys.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from odb_lightning.runtime.errors import MetadataChannelError


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


class MetadataStore:
    """This rank's main-process handle on the metadata store: the server on rank 0, a
    client (connected once, when the loader is built) elsewhere.

    It orders the start of each pipeline: rank 0 forks its worker and collate processes
    first, the other ranks after it. The store server is a thread of rank 0's main
    process and formats the address of every connection it accepts with the libc
    resolver; a process forked while that thread holds the resolver's lock inherits it
    locked, and the forked collate process then hangs forever on its own first connect.
    Connections come from the other ranks' collate processes, so they must not exist yet
    while rank 0 forks. Waiting uses the connection made at build time: it needs no accept.

    Args:
        store: The ``TCPStore`` (server on rank 0, client on the other ranks).
        rank: This rank.
    """

    def __init__(self, store: dist.TCPStore, rank: int) -> None:
        self._store, self._rank = store, rank

    def wait_for_rank_zero(self, prefix: str, timeout_s: float) -> None:
        """On ranks > 0: block until rank 0 has started the pipeline of ``prefix``.

        Raises:
            MetadataChannelError: Rank 0 did not start it within ``timeout_s``.
        """
        if self._rank == 0:
            return
        try:
            self._store.wait([f"{prefix}/started"], timedelta(seconds=timeout_s))
        except RuntimeError as error:  # torch's DistStoreError on a timeout
            raise MetadataChannelError(
                f"rank {self._rank} waited {timeout_s}s for rank 0 to start the loader "
                f"processes of the ODB metadata channel {prefix}: {error}"
            ) from error

    def rank_zero_started(self, prefix: str) -> None:
        """On rank 0: every process of the pipeline of ``prefix`` has been forked."""
        if self._rank == 0:
            self._store.set(f"{prefix}/started", "1")


JOIN_TIMEOUT = timedelta(seconds=300)
"""How long rank 0 waits for the other ranks' main processes to connect to the store
(the default ``TCPStore`` timeout: they are past the same collective already)."""


def numeric_address(host: str, port: int) -> str:
    """``host`` as a numeric address (IPv4 first), resolved in this process.

    The collate processes are forked from a process whose other threads (the store
    server, the training group) may be inside the libc resolver at that moment; a child
    would then wait forever on the resolver lock it inherited. With a numeric address
    their ``getaddrinfo`` never enters the resolver.
    """
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found.sort(key=lambda entry: entry[0] != socket.AF_INET)
    return str(found[0][4][0])


def host_rendezvous(world_size: int, rank: int) -> tuple[Rendezvous, MetadataStore]:
    """Start the store on rank 0 and share its address over the default group.

    A collective: every rank of the default group must call it. Returns the rendezvous
    (with the store's host as a numeric address: :func:`numeric_address`) and this
    rank's :class:`MetadataStore`, which must stay referenced while the channel is in use.
    """
    store = None
    payload: list[object] = [None]
    if rank == 0:
        host = socket.gethostname()
        store = dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False)
        payload = [(host, store.port, uuid.uuid4().hex)]
    dist.broadcast_object_list(payload, src=0)
    host, port, prefix = payload[0]
    address = numeric_address(host, port)
    joined = f"odb/{prefix}/joined"
    if store is None:
        store = dist.TCPStore(address, port, None, is_master=False)
        # A round trip: the server has accepted (and formatted) this connection after it.
        store.set(f"{joined}/{rank}", "1")
    else:
        # Rank 0 forks nothing until every client connection has been accepted.
        store.wait([f"{joined}/{r}" for r in range(1, world_size)], JOIN_TIMEOUT)
    return Rendezvous(address, port, rank, world_size, prefix), MetadataStore(store, rank)
