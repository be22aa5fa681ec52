"""The metadata store's address and the order in which ranks fork their loader processes.

A collate process forked while a thread of its parent holds the libc resolver's lock
hangs on its first connect (the store formats every address through the resolver), so
the collate processes get a numeric address and rank 0 forks before any other rank's
collate process can connect to its store.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest
import torch.distributed as dist

from odb_lightning.runtime.errors import MetadataChannelError
from odb_lightning.runtime.rendezvous import MetadataStore, host_rendezvous, numeric_address


def test_names_resolve_to_a_numeric_address_in_the_caller() -> None:
    assert numeric_address("localhost", 80) in ("127.0.0.1", "::1")
    assert numeric_address("127.0.0.1", 80) == "127.0.0.1"
    ipaddress.ip_address(numeric_address(socket.gethostname(), 80))  # raises if not numeric


def test_host_rendezvous_hands_out_a_numeric_host() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        rendezvous, _ = host_rendezvous(1, 0)
        ipaddress.ip_address(rendezvous.host)  # raises if it is a host name
        client = dist.TCPStore(rendezvous.host, rendezvous.port, None, is_master=False)
        client.set("key", "value")
        assert client.get("key") == b"value"
    finally:
        dist.destroy_process_group()


def test_other_ranks_start_only_after_rank_zero() -> None:
    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, None, is_master=False)
    rank_zero, rank_one = MetadataStore(server, 0), MetadataStore(client, 1)
    rank_zero.wait_for_rank_zero("odb/p/1", 0.1)  # rank 0 never waits
    with pytest.raises(MetadataChannelError, match=r"rank 1 waited 0.2s for rank 0 .* odb/p/1"):
        rank_one.wait_for_rank_zero("odb/p/1", 0.2)
    rank_zero.rank_zero_started("odb/p/1")
    rank_one.wait_for_rank_zero("odb/p/1", 5.0)
    with pytest.raises(MetadataChannelError):
        rank_one.wait_for_rank_zero("odb/p/2", 0.2)  # each generation has its own key
