"""Where the collate processes of all ranks meet to build their Gloo metadata channel.

The channel lives on the job's own store: the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``
through which the default process group was built (hosted by rank 0, or by torchrun's
agent), under a key prefix of its own. No second port is opened and no host name is
guessed: ``MASTER_ADDR`` already reaches every node, or the job would not have started.
Each loader gets its own prefix (:meth:`JobRendezvous.for_loader`) and each channel a
generation under it, so a restarted pipeline never reads a previous channel's keys.

The Gloo device of the channel binds the interface named by ``GLOO_SOCKET_IFNAME``,
else the one named by ``NCCL_SOCKET_IFNAME``, else the interface this node uses to
reach ``MASTER_ADDR`` (:func:`~odb_lightning.runtime.binding.gloo_binding`), never the address
of the host name.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from odb_lightning.runtime.binding import GlooBinding, gloo_binding
from odb_lightning.runtime.errors import MetadataChannelError
from odb_lightning.runtime.store_keys import get_checked, set_once


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Address of the metadata channel's store and this rank's place in it.

    Attributes:
        prefix: Key prefix shared by the ranks of one loader (unique per loader).
        binding: What the channel's Gloo device binds (:func:`gloo_binding`).
    """

    host: str
    port: int
    rank: int
    world_size: int
    prefix: str
    binding: GlooBinding = GlooBinding()

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
        return (
            f"{self.host}:{self.port}/{self.channel_prefix(generation)}, "
            f"Gloo on {self.binding.describe()}"
        )


def default_world() -> tuple[int, int]:
    """``(world_size, rank)`` of the initialized default process group, else ``(1, 0)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class MetadataStore:
    """This rank's main-process connection to the job store (made once, when the loaders
    are set up), which orders the start of each pipeline: rank 0 forks its worker and
    collate processes first, the other ranks after it.

    The store server may be a thread of rank 0's main process (the default group's store
    without torchrun). It formats the address of every connection it accepts with the
    libc resolver; a process forked while that thread holds the resolver's lock inherits
    it locked, and the forked collate process then hangs forever on its own first
    connect. Connections come from the other ranks' collate processes, so they must not
    exist yet while rank 0 forks. Waiting uses the connection made at setup: it needs
    no accept.

    Args:
        store: A client of the job store.
        rank: This rank.
    """

    def __init__(self, store: dist.Store, rank: int) -> None:
        self._store, self._rank = store, rank

    def wait_for_rank_zero(self, prefix: str, timeout_s: float) -> None:
        """On ranks > 0: block until rank 0 has started the pipeline of ``prefix``.

        Raises:
            MetadataChannelError: Rank 0 did not start it within ``timeout_s``.
        """
        if self._rank == 0:
            return
        key = f"{prefix}/started"
        try:
            self._store.wait([key], timedelta(seconds=timeout_s))
        except RuntimeError as error:  # torch's DistStoreError on a timeout
            raise MetadataChannelError(
                f"rank {self._rank} waited {timeout_s}s for rank 0 to start the loader "
                f"processes of the ODB metadata channel {prefix}: {error}"
            ) from error
        check_value(get_checked(self._store, key, key), STARTED, key)

    def rank_zero_started(self, prefix: str) -> None:
        """On rank 0: every process of the pipeline of ``prefix`` has been forked."""
        if self._rank == 0:
            set_once(self._store, f"{prefix}/started", STARTED, f"{prefix}/started")

    @contextlib.contextmanager
    def rank_zero_first(self, prefix: str, timeout_s: float) -> Iterator[None]:
        """Start the pipeline of ``prefix`` inside: on rank 0 first, then on the others
        (:meth:`wait_for_rank_zero`, :meth:`rank_zero_started`)."""
        self.wait_for_rank_zero(prefix, timeout_s)
        yield
        self.rank_zero_started(prefix)


STARTED = b"started"
JOINED = b"joined"


def check_value(payload: bytes, expected: bytes, key: str) -> None:
    """A checked payload (:mod:`~odb_lightning.runtime.store_keys`) must be ``expected``."""
    if payload != expected:
        raise MetadataChannelError(
            f"the job store's key {key!r} holds the ODB payload {payload[:40]!r}, expected "
            f"{expected!r}: something other than this job's ranks wrote into the job's store "
            "(MASTER_PORT); see 'The job store' in docs/reliability.md"
        )


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


def job_store_address(environ: dict[str, str] | None = None) -> tuple[str, int]:
    """The job store's numeric address and port, from ``MASTER_ADDR`` and ``MASTER_PORT``.

    Raises:
        MetadataChannelError: A variable is unset or invalid, or ``MASTER_ADDR`` does not
            resolve on this node (the message names the variable to set).
    """
    env = os.environ if environ is None else environ
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port:
        raise MetadataChannelError(
            "the ODB metadata channel uses the job's store at MASTER_ADDR:MASTER_PORT, "
            f"but MASTER_ADDR={host!r} and MASTER_PORT={port!r}: launch with Lightning, "
            "torchrun or SLURM (they set both), or pass rendezvous= to the loader"
        )
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise MetadataChannelError(f"MASTER_PORT must be a TCP port, got {port!r}")
    try:
        return numeric_address(host, int(port)), int(port)
    except OSError as error:
        raise MetadataChannelError(
            f"MASTER_ADDR {host!r} does not resolve on this node ({error}): set MASTER_ADDR "
            "to an address or name that every node resolves to rank 0's node"
        ) from error


def host_job_store(host: str, port: int) -> dist.TCPStore:
    """The job's store server, listening on ``host`` (numeric) only, not on every interface.

    torch's own server binds ``MASTER_PORT`` on all interfaces. Call this in the process
    that hosts the job's store (rank 0), before the default process group is built, and
    keep the result alive until the job ends: ``init_process_group`` (``env://``) builds a
    multi-tenant ``TCPStore`` on ``MASTER_PORT``, which reuses this server.

    Raises:
        MetadataChannelError: The address cannot be bound on this node (the message names
            ``MASTER_ADDR`` and ``MASTER_PORT``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
        # The server listens on this socket; multi_tenant: torch's store on the port reuses it.
        server = dist.TCPStore(
            host,
            port,
            None,
            is_master=True,
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=listener.fileno(),
            use_libuv=True,
        )
    except OSError as error:
        listener.close()
        raise MetadataChannelError(
            f"cannot host the job's store on MASTER_ADDR:MASTER_PORT ({host}:{port}) on this "
            f"node: {error}; set MASTER_ADDR to an address of this node and MASTER_PORT to a "
            "free port"
        ) from error
    listener.detach()  # the server owns the socket now (libuv closes it with the server)
    return server


class JobRendezvous:
    """The job store and this rank's place in it, for every ODB loader of the job.

    Args:
        host: Numeric address of the job store.
        port: Its port.
        rank: This rank in the default process group.
        world_size: Ranks in the default process group.
        job_prefix: Key prefix of this job's loaders (equal on every rank).
        store: This rank's client of the store (see :class:`MetadataStore`).
        binding: What the channel's Gloo device binds on this node.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        job_prefix: str,
        store: dist.Store,
        binding: GlooBinding,
    ) -> None:
        self.host, self.port, self.rank, self.world_size = host, port, rank, world_size
        self.job_prefix, self.binding = job_prefix, binding
        self.store = MetadataStore(store, rank)

    @classmethod
    def of_default_group(cls, timeout_s: float) -> JobRendezvous | None:
        """:meth:`connect` with the initialized default process group's world size and
        rank (a collective), or ``None`` when it has one rank or none is initialized."""
        world_size, rank = default_world()
        return cls.connect(world_size, rank, timeout_s) if world_size > 1 else None

    @classmethod
    def connect(cls, world_size: int, rank: int, timeout_s: float) -> JobRendezvous:
        """Connect this rank to the job store and agree on the job prefix.

        A collective (one broadcast over the default group): every rank must call it, in
        the same order relative to other collectives. Rank 0 returns only once every
        other rank's main process is connected, so it may fork its loader processes.

        Raises:
            MetadataChannelError: No store address, a bad interface, or a rank that does
                not connect in time; the message names the variable to set.
        """
        problem, host, port, binding = None, "", 0, GlooBinding()
        try:
            host, port = job_store_address()
            binding = gloo_binding(host)
        except MetadataChannelError as error:
            problem = str(error)
        # Every rank learns every rank's outcome (and rank 0's prefix) in one collective, so
        # a node that cannot meet fails the whole job at once, naming itself, instead of
        # leaving the others in the next collective.
        outcomes: list[object] = [None] * world_size
        dist.all_gather_object(outcomes, (problem, uuid.uuid4().hex if rank == 0 else None))
        failed = [f"rank {r}: {p}" for r, (p, _) in enumerate(outcomes) if p]  # type: ignore[misc]
        if failed:
            raise MetadataChannelError("the ODB metadata channel cannot meet: " + "; ".join(failed))
        job_prefix = str(outcomes[0][1])  # type: ignore[index]
        timeout = timedelta(seconds=timeout_s)
        try:
            store = dist.TCPStore(host, port, None, is_master=False, timeout=timeout)
        except RuntimeError as error:
            raise MetadataChannelError(
                f"rank {rank} could not connect to the job store at MASTER_ADDR:MASTER_PORT "
                f"({host}:{port}) within {timeout_s}s: {error}"
            ) from error
        joined = f"odb/{job_prefix}/joined"
        if rank == 0:
            keys = [f"{joined}/{r}" for r in range(1, world_size)]
            try:
                store.wait(keys, timeout)
            except RuntimeError as error:
                raise MetadataChannelError(
                    f"rank 0 waited {timeout_s}s for every rank to "
                    f"connect to the job store at {host}:{port}: {error}"
                ) from error
            for key in keys:
                check_value(get_checked(store, key, key), JOINED, key)
        else:
            # A round trip: the server has accepted (and formatted) this connection after it.
            set_once(store, f"{joined}/{rank}", JOINED, f"{joined}/{rank}")
        return cls(host, port, rank, world_size, job_prefix, store, binding)

    def for_loader(self, name: str) -> Rendezvous:
        """The rendezvous of the loader called ``name`` (unique per loader in a job).

        Every rank builds its loaders in the same order with the same names, so the
        derived key prefix agrees across ranks without another collective.
        """
        return Rendezvous(
            self.host,
            self.port,
            self.rank,
            self.world_size,
            f"{self.job_prefix}-{name}",
            self.binding,
        )
