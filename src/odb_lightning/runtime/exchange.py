"""The per-round metadata exchange: an all-gather of one fixed-size integer message.

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

from odb_lightning.core.config import BatchingConfig, check_settings_agree
from odb_lightning.runtime.errors import MetadataChannelError
from odb_lightning.runtime.rendezvous import Rendezvous


class Channel(Protocol):
    """An all-gather of equal-length integer messages across ranks."""

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        """Every rank's ``message``, by rank; ``context`` names the round in errors."""
        ...

    def close(self) -> None: ...


class LocalChannel:
    """The exchange of a single rank."""

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        return [list(message)]

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
        try:
            store = dist.TCPStore(
                rendezvous.host, rendezvous.port, None, is_master=False, timeout=timeout
            )
            prefixed = dist.PrefixStore(rendezvous.channel_prefix(generation), store)
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = rendezvous.binding.devices()
            self._group: dist.ProcessGroupGloo | None = dist.ProcessGroupGloo(
                prefixed, rendezvous.rank, rendezvous.world_size, options
            )
        except RuntimeError as error:
            raise MetadataChannelError(
                f"rank {rendezvous.rank} could not connect to {self._where} within "
                f"{timeout_s}s: {error}"
            ) from error

    def allgather(self, message: list[int], context: str) -> list[list[int]]:
        if self._group is None:
            raise MetadataChannelError(f"{self._where} is closed")
        local = torch.tensor(message, dtype=torch.int64)
        gathered = [torch.empty_like(local) for _ in range(self._rendezvous.world_size)]
        try:
            self._group.allgather([gathered], [local]).wait()
        except RuntimeError as error:
            raise MetadataChannelError(
                f"{self._where} failed on rank {self._rendezvous.rank} at {context} "
                f"(a peer rank died, hangs or is out of step): {error}"
            ) from error
        return [t.tolist() for t in gathered]

    def close(self) -> None:
        """Shut the Gloo group down; later calls fail with :class:`MetadataChannelError`."""
        group, self._group = self._group, None
        if group is not None:
            group.shutdown()


def open_channel(config: BatchingConfig, rendezvous: Rendezvous | None, generation: int) -> Channel:
    """Connect the channel and check that every rank runs the same loader settings.

    Raises:
        MetadataChannelError: The channel could not be built or the handshake failed.
        SettingsMismatchError: Ranks disagree on a setting (named in the message).
    """
    if rendezvous is None or rendezvous.world_size == 1:
        return LocalChannel()
    channel = GlooChannel(rendezvous, generation, config.alignment_timeout_s)
    try:
        check_settings_agree(channel.allgather(config.handshake(), "the settings handshake"))
    except Exception:
        channel.close()
        raise
    return channel
