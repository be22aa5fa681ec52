"""Every ODB value in the job's store is framed, written once and checked on read: a value
something else wrote is refused naming the key and what was expected, never handed to
Gloo's parser (which died in C++ on it) or waited out."""

from __future__ import annotations

import socket
import struct
import zlib

import psutil
import pytest
import torch.distributed as dist

from odb_lightning.runtime.errors import MetadataChannelError
from odb_lightning.runtime.rendezvous import MetadataStore, host_job_store
from odb_lightning.runtime.store_keys import (
    SCHEMA_VERSION,
    FramedStore,
    frame_value,
    get_checked,
    set_once,
    unframe_value,
)


def _store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)


def test_a_framed_value_reads_back_as_written() -> None:
    for payload in (b"", b"joined", bytes(range(256)) * 4):
        assert unframe_value("k", frame_value(payload)) == payload


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"1", "1 bytes starting b'1'"),
        (b"\xff" * 64, "64 bytes starting b'\\xff"),
        (struct.pack(">3sBII", b"ODB", SCHEMA_VERSION + 1, 0, zlib.crc32(b"")), "schema version 2"),
        (frame_value(b"abc")[:-1], "a header announcing 3 payload bytes, followed by 2"),
        (frame_value(b"abc")[:-1] + b"x", "a payload whose CRC-32 does not match its header"),
    ],
)
def test_a_foreign_value_is_refused_naming_the_key_and_the_frame(value: bytes, problem: str):
    with pytest.raises(MetadataChannelError) as raised:
        unframe_value("odb/job-loader/0/started", value)
    message = str(raised.value)
    assert message.startswith("the job store's key 'odb/job-loader/0/started' holds "), message
    assert problem in message
    assert (
        f"expected an ODB value: the 12-byte header b'ODB' + schema version {SCHEMA_VERSION}"
        in (message)
    )
    assert "docs/reliability.md" in message


def test_a_key_is_written_once_and_a_foreign_value_there_is_named() -> None:
    store = _store()
    set_once(store, "mine", b"v", "mine")
    assert get_checked(store, "mine", "mine") == b"v"
    foreign = dist.TCPStore("127.0.0.1", store.port, None, is_master=False)
    foreign.set("taken", b"garbage")
    with pytest.raises(MetadataChannelError, match=r"key 'taken' already holds 7 bytes .*did not"):
        set_once(store, "taken", b"v", "taken")
    assert store.get("taken") == b"garbage"  # not overwritten: the reader fails too


def test_the_framed_store_keeps_the_first_problem_for_the_channel() -> None:
    store = _store()
    framed = FramedStore(dist.PrefixStore("odb/p/0", store), "odb/p/0")
    framed.set("0/0", b"address")
    assert framed.get("0/0") == b"address"
    assert store.get("odb/p/0/0/0") == frame_value(b"address")
    store.set("odb/p/0/0/1", b"\x00" * 5)
    with pytest.raises(MetadataChannelError, match="key 'odb/p/0/0/1' holds 5 bytes"):
        framed.get("0/1")
    assert framed.problem is not None and "'odb/p/0/0/1'" in str(framed.problem)


def test_a_foreign_started_key_stops_the_other_ranks_naming_it() -> None:
    """A foreign client overwrites rank 0's ``started`` key before rank 1 reads it."""
    store = _store()
    MetadataStore(store, 0).rank_zero_started("odb/j-loader/0")
    dist.TCPStore("127.0.0.1", store.port, None, is_master=False).set(
        "odb/j-loader/0/started", b"x" * 20
    )
    with pytest.raises(MetadataChannelError, match=r"key 'odb/j-loader/0/started' holds 20 bytes"):
        MetadataStore(store, 1).wait_for_rank_zero("odb/j-loader/0", timeout_s=30.0)


def test_the_job_store_listens_on_the_job_address_only(monkeypatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = host_job_store("127.0.0.1", port)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)  # env://: reuses the server
    try:
        on_port = [
            c.laddr.ip
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert on_port == ["127.0.0.1"]  # one listener, not 0.0.0.0 or ::
        dist.TCPStore("127.0.0.1", port, None, is_master=False).set("k", "v")
        assert server.get("k") == b"v"
    finally:
        dist.destroy_process_group()


def test_a_job_store_address_this_node_cannot_bind_names_the_variables() -> None:
    with pytest.raises(MetadataChannelError, match=r"MASTER_ADDR:MASTER_PORT \(192\.0\.2\.1:"):
        host_job_store("192.0.2.1", 29500)  # TEST-NET-1: no interface of this node
