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

from odb_lightning.runtime.binding import GlooBinding, gloo_binding
from odb_lightning.runtime.errors import MetadataChannelError
from odb_lightning.runtime.rendezvous import (
    JobRendezvous,
    MetadataStore,
    job_store_address,
    numeric_address,
)


def test_names_resolve_to_a_numeric_address_in_the_caller() -> None:
    assert numeric_address("localhost", 80) in ("127.0.0.1", "::1")
    assert numeric_address("127.0.0.1", 80) == "127.0.0.1"
    ipaddress.ip_address(numeric_address(socket.gethostname(), 80))  # raises if not numeric


def test_the_channel_meets_on_the_job_store_under_a_numeric_address(monkeypatch) -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        job = JobRendezvous.connect(1, 0, timeout_s=5.0)
        rendezvous = job.for_loader("train")
        ipaddress.ip_address(rendezvous.host)  # raises if it is a host name
        assert rendezvous.port == store.port  # no second listening port
        assert job.for_loader("val").prefix != rendezvous.prefix
        client = dist.TCPStore(rendezvous.host, rendezvous.port, None, is_master=False)
        client.set("key", "value")
        assert store.get("key") == b"value"
    finally:
        dist.destroy_process_group()


def test_the_job_store_address_names_the_variable_to_set() -> None:
    with pytest.raises(MetadataChannelError, match="MASTER_ADDR=None and MASTER_PORT"):
        job_store_address({})
    with pytest.raises(MetadataChannelError, match="MASTER_PORT must be a TCP port"):
        job_store_address({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"})
    unresolvable = {"MASTER_ADDR": "trainer-7f9c4d-0.invalid", "MASTER_PORT": "29500"}
    with pytest.raises(MetadataChannelError, match=r"MASTER_ADDR 'trainer-7f9c4d-0.invalid'"):
        job_store_address(unresolvable)
    assert job_store_address({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"})[1] == 29500


def test_the_gloo_device_binds_the_named_interface_or_the_route_to_the_store() -> None:
    assert gloo_binding("127.0.0.1", {}) == GlooBinding(address="127.0.0.1")
    assert gloo_binding("127.0.0.1", {"GLOO_SOCKET_IFNAME": "lo"}).interfaces == ("lo",)
    # NCCL's spelling is mapped when only it is set: a prefix, or =name exactly.
    assert gloo_binding("127.0.0.1", {"NCCL_SOCKET_IFNAME": "=lo"}).interfaces == ("lo",)
    assert gloo_binding("127.0.0.1", {"NCCL_SOCKET_IFNAME": "l"}).interfaces == ("lo",)
    # An exclusion list names no interface to bind: the route decides.
    assert gloo_binding("127.0.0.1", {"NCCL_SOCKET_IFNAME": "^docker"}).interfaces == ()
    with pytest.raises(MetadataChannelError, match=r"GLOO_SOCKET_IFNAME names \['ib7'\]"):
        gloo_binding("127.0.0.1", {"GLOO_SOCKET_IFNAME": "ib7"})
    with pytest.raises(MetadataChannelError, match="set GLOO_SOCKET_IFNAME"):
        gloo_binding("127.0.0.1", {"NCCL_SOCKET_IFNAME": "=ib7"})
    # The named interface's device is built (this is what the collate process does).
    assert len(GlooBinding(interfaces=("lo",)).devices()) == 1


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


def test_a_host_name_mapped_to_loopback_is_refused_in_a_job_of_several_nodes() -> None:
    two_nodes = {"MASTER_ADDR": "trainer-0", "GROUP_WORLD_SIZE": "2"}
    with pytest.raises(MetadataChannelError, match="set GLOO_SOCKET_IFNAME"):
        gloo_binding("127.0.1.1", two_nodes)
    # One node, a numeric loopback address or localhost: loopback is what was asked for.
    assert gloo_binding("127.0.1.1", {"MASTER_ADDR": "trainer-0"}).address.startswith("127.")
    numeric = {"MASTER_ADDR": "127.0.0.1", "GROUP_WORLD_SIZE": "2"}
    assert gloo_binding("127.0.0.1", numeric).address == "127.0.0.1"
    local = {"MASTER_ADDR": "localhost", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert gloo_binding("127.0.0.1", local).address == "127.0.0.1"


def _connect_rank(rank: int, port: int, results: object) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    if rank == 1:  # after the training group (NCCL on GPUs) is up: only the channel's
        os.environ["GLOO_SOCKET_IFNAME"] = "nonexistent0"
    try:
        JobRendezvous.connect(2, rank, timeout_s=5.0)
        results.put((rank, "connected"))
    except MetadataChannelError as error:
        results.put((rank, str(error)))
    finally:
        dist.destroy_process_group()


def test_a_rank_that_cannot_meet_fails_every_rank_naming_itself() -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    results = context.Queue()
    ranks = [context.Process(target=_connect_rank, args=(r, server.port, results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    # Generous bounds against a hang only: each rank fails on its own 5 s channel timeout
    # at most, but under load two spawned children may take a minute to import torch.
    outcomes = dict(results.get(timeout=300) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
    for rank in (0, 1):
        assert "rank 1: GLOO_SOCKET_IFNAME names ['nonexistent0']" in outcomes[rank], outcomes
