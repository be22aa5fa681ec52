"""The per-round metadata exchange: an all-gather of one fixed-size integer message (and,
in a pooled round, an all-to-all of the moved samples' bytes).

One rank: the exchange is local. Several: a ``ProcessGroupGloo`` built directly on a
``PrefixStore`` of the job's store (``runtime/rendezvous.py``), owned by whichever
process runs the rounds (the collate process, or the main process with ``num_workers=0``). It never
initializes or touches the default process group, so it works the same under fork (where
the child inherits the parent's group state) and spawn.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.handshake import (
    DataHandshake,
    check_data_agree,
    check_settings_agree,
    handshake_message,
)
from odb_lightning.core.wire import WireFormatError, check_message, report_max_steps
from odb_lightning.runtime.errors import MetadataChannelError
from odb_lightning.runtime.rendezvous import Rendezvous
from odb_lightning.runtime.store_keys import FramedStore


class Channel(Protocol):
    """An all-gather of equal-length integer messages across ranks, and point-to-point
    bytes (a pooled round's moved samples)."""

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        """Every rank's ``message``, by rank; ``context`` names the round in errors."""
        ...

    def send_bytes(self, to: dict[int, bytes], context: str) -> list[bytes]:
        """Send ``to[r]`` (of any size) to rank ``r``, each rank only what is meant for
        it; return what every rank sent this one, by rank (``b""``: nothing)."""
        ...

    def close(self) -> None: ...


class LocalChannel:
    """The exchange of a single rank."""

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        return [list(message)]

    def send_bytes(self, to: dict[int, bytes], context: str) -> list[bytes]:
        return [to.get(0, b"")]

    def close(self) -> None:
        """Nothing to release."""


class GlooChannel:
    """All-gather over a dedicated Gloo group (see the module docstring).

    Args:
        rendezvous: Store address and this rank's place.
        generation: Index of this channel among those the loader opened (key prefix).
        timeout_s: Bound on connecting and on every all-gather.
    """

    def __init__(self, rendezvous: Rendezvous, generation: int, timeout_s: float) -> None:
        self._rendezvous = rendezvous
        self._where = f"the ODB metadata channel ({rendezvous.describe(generation)})"
        timeout = timedelta(seconds=timeout_s)
        framed: FramedStore | None = None
        try:
            store = dist.TCPStore(
                rendezvous.host, rendezvous.port, None, is_master=False, timeout=timeout
            )
            prefix = rendezvous.channel_prefix(generation)
            # Gloo's address records are framed and checked (runtime/store_keys.py).
            framed = FramedStore(dist.PrefixStore(prefix, store), prefix)
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = rendezvous.binding.devices()
            self._group: dist.ProcessGroupGloo | None = dist.ProcessGroupGloo(
                framed, rendezvous.rank, rendezvous.world_size, options
            )
        except (RuntimeError, ValueError) as error:
            if framed is not None and framed.problem is not None:
                # A foreign value in the store: its own message, not Gloo's echo of it.
                raise MetadataChannelError(
                    f"rank {rendezvous.rank} could not build {self._where}: {framed.problem}"
                ) from error
            raise MetadataChannelError(
                f"rank {rendezvous.rank} could not connect to {self._where} within "
                f"{timeout_s}s (store prefix {rendezvous.channel_prefix(generation)!r}): "
                f"{error}"
            ) from error

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        if self._group is None:
            raise MetadataChannelError(f"{self._where} is closed")
        local = torch.tensor(message, dtype=torch.int64)
        messages = [t.tolist() for t in self._gather(local, context)]
        check_messages(messages, message, context, f"{self._where} on rank {self._rendezvous.rank}")
        return messages

    def send_bytes(self, to: dict[int, bytes], context: str) -> list[bytes]:
        """Two all-to-alls: the sizes, then the bytes, so each rank receives only what
        it is sent (not ``W`` times the largest, as an all-gather would)."""
        world = self._rendezvous.world_size
        if not set(to) <= set(range(world)):
            raise ValueError(f"send_bytes to ranks {sorted(to)} of a world of {world}")
        outgoing = [to.get(rank, b"") for rank in range(world)]
        sent = [len(payload) for payload in outgoing]
        ones = [1] * world
        sizes = torch.tensor(sent, dtype=torch.int64)
        received = self._alltoall(sizes, ones, ones, context).tolist()
        joined = b"".join(outgoing)
        local = (
            torch.frombuffer(bytearray(joined), dtype=torch.uint8)
            if joined
            else torch.empty(0, dtype=torch.uint8)
        )
        flat = self._alltoall(local, received, sent, context).numpy().tobytes()
        offsets = [0]
        for size in received:
            offsets.append(offsets[-1] + size)
        return [flat[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]

    def _alltoall(
        self, local: torch.Tensor, out_sizes: list[int], in_sizes: list[int], context: str
    ) -> torch.Tensor:
        if self._group is None:
            raise MetadataChannelError(f"{self._where} is closed")
        out = torch.empty(sum(out_sizes), dtype=local.dtype)
        try:
            options = dist.AllToAllOptions()
            self._group.alltoall_base(out, local, out_sizes, in_sizes, options).wait()
        except (RuntimeError, MemoryError) as error:
            raise MetadataChannelError(
                f"{self._where} failed on rank {self._rendezvous.rank} at {context} "
                f"(a peer rank died, hangs or is out of step): {error}"
            ) from error
        return out

    def _gather(self, local: torch.Tensor, context: str) -> list[torch.Tensor]:
        if self._group is None:
            raise MetadataChannelError(f"{self._where} is closed")
        gathered = [torch.empty_like(local) for _ in range(self._rendezvous.world_size)]
        try:
            self._group.allgather([gathered], [local]).wait()
        except (RuntimeError, MemoryError) as error:
            raise MetadataChannelError(
                f"{self._where} failed on rank {self._rendezvous.rank} at {context} "
                f"(a peer rank died, hangs or is out of step): {error}"
            ) from error
        return gathered

    def close(self) -> None:
        """Shut the Gloo group down; later calls fail with :class:`MetadataChannelError`."""
        group, self._group = self._group, None
        if group is not None:
            group.shutdown()


HANDSHAKE_CONTEXT = "the settings handshake"


def check_messages(messages: list[list[int]], local: list[int], context: str, where: str) -> None:
    """Raise :class:`MetadataChannelError` naming the rank and ``context`` when a gathered
    message is not of the local message's kind: a wrong length, or (for a round report)
    a field no report holds (:func:`~odb_lightning.core.wire.check_message`)."""
    max_steps = None if context == HANDSHAKE_CONTEXT else report_max_steps(local)
    for rank, message in enumerate(messages):
        try:
            if len(message) != len(local):
                raise WireFormatError(f"{len(message)} integers, expected {len(local)}")
            if max_steps is not None:
                check_message(message, max_steps)
        except WireFormatError as error:
            raise MetadataChannelError(
                f"{where}: the message of rank {rank} at {context} is malformed ({error}); "
                "a peer runs another version, or something else writes to this channel"
            ) from None


def open_channel(
    config: BatchingConfig,
    rendezvous: Rendezvous | None,
    generation: int,
    data: DataHandshake | None = None,
) -> Channel:
    """Connect the channel and check, in one all-gather, that every rank runs the same
    loader settings and sees the same data (``data``: ``len(dataset)``, ``max_seq_len``,
    the ``shard=`` indices; ``None``: not compared from this rank).

    Raises:
        MetadataChannelError: The channel could not be built or the handshake failed.
        SettingsMismatchError: Ranks disagree on a setting or on their data (named in
            the message), or their ``shard=`` indices overlap.
    """
    if rendezvous is None or rendezvous.world_size == 1:
        return LocalChannel()
    channel = GlooChannel(rendezvous, generation, config.loader.alignment_timeout_s)
    try:
        messages = channel.allgather(handshake_message(config, data), HANDSHAKE_CONTEXT)
        check_settings_agree(messages)
        check_data_agree(messages)
    except Exception:
        channel.close()
        raise
    return channel
