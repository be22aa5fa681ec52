"""Rank 0 of a Lightning-launched job hosts the job's store on ``MASTER_ADDR`` only, except
where that would lock the other nodes out: a name that resolves to the loopback address on
rank 0's node of a multi-node job."""

from __future__ import annotations

import logging
import socket

import lightning.pytorch as pl
import pytest

from odb_lightning.lit.job_store import bind_job_store


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("num_nodes", [1, 2])
def test_the_store_binds_the_loopback_only_on_a_one_node_job(
    num_nodes: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    trainer = pl.Trainer(
        accelerator="cpu", strategy="ddp", devices=2, num_nodes=num_nodes, logger=False
    )
    with caplog.at_level(logging.WARNING, logger="odb_lightning.lit.job_store"):
        server = bind_job_store(trainer)
    if num_nodes == 1:
        assert server is not None and server.port == port
        server.set("k", "v")
        assert server.get("k") == b"v"
    else:
        assert server is None
        assert "resolves to the loopback address 127.0.0.1 on rank 0 of a 2-node job" in caplog.text
