"""W&B logging stays offline and holds each run's summary figures.

``conf/logger/wandb.yaml`` sets ``offline: true`` (W&B's own ``WANDB_MODE`` is cleared
here: the config alone must keep the run offline). Every address W&B could reach
(``WANDB_BASE_URL`` and the HTTP(S) proxies) points at a listening socket of this test,
which counts the connections it gets: an online attempt would show as a connection.

wandb >= 0.2x writes no ``files/wandb-summary.json`` for an offline run: the run lives in
its transaction log ``run-<id>.wandb`` (what ``wandb sync`` uploads). The test replays the
summary records of that log, as W&B does when it syncs, and compares them with the run's
``summary.json``.

The run is a Hydra multirun of two single-process jobs: each job must get a W&B run of its
own (a ``WandbLogger`` reuses a run still open in its process, so the application must
finish the run of a job before the next one starts).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = [2048, 4096]
# Compared between summary.json and the W&B run summary.
FIGURES = [
    "emitted_samples",
    "padding_efficiency",
    "real_tokens",
    "padded_tokens",
    "loss_tokens",
    "optimizer_steps",
    "token_budget",
    "train_loss",
    "val_loss",
]

# The W&B transaction log is a LevelDB-style log: a 7-byte file header, then 32 KiB blocks
# of chunks with a 7-byte header each (CRC32 uint32, length uint16, type uint8: 1 = a whole
# record, 2/3/4 = its first/middle/last part), each record one protobuf ``Record``.
LOG_HEADER = b":W&B"
LOG_BLOCK = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[: len(LOG_HEADER)] == LOG_HEADER, f"not a W&B transaction log: {path}"
    position, parts = 7, []
    while position + CHUNK_HEADER.size <= len(data):
        block_left = LOG_BLOCK - position % LOG_BLOCK
        if block_left < CHUNK_HEADER.size:  # a block's tail too short for a header: padding
            position += block_left
            continue
        _, length, kind = CHUNK_HEADER.unpack_from(data, position)
        if kind == 0:  # zero padding up to the next block
            position += block_left
            continue
        start = position + CHUNK_HEADER.size
        parts.append(data[start : start + length])
        position = start + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def replay_run_name(path: Path) -> str:
    """The run's display name, from the log's run record."""
    for record in read_records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run.display_name
    raise AssertionError(f"no run record in {path}")


def replay_summary(path: Path) -> tuple[dict[str, object], int | None]:
    """The run summary after every summary record of the log, and the exit code."""
    summary: dict[str, object] = {}
    exit_code = None
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
            for item in record.summary.remove:
                summary.pop(item.key or "/".join(item.nested_key), None)
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return summary, exit_code


class Tripwire:
    """A local TCP listener that counts the connections it receives."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections = 0
        self._open = True
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while self._open:
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        """Stop listening; connections still waiting in the backlog are counted too."""
        if not self._open:
            return
        self._open = False
        self._thread.join(timeout=5)
        self.server.setblocking(False)
        while True:
            try:
                connection, _ = self.server.accept()
            except BlockingIOError:
                break
            self.connections += 1
            connection.close()
        self.server.close()


@pytest.fixture
def tripwire() -> Iterator[Tripwire]:
    wire = Tripwire()
    yield wire
    wire.close()


def test_tripwire_counts_a_connection(tripwire: Tripwire) -> None:
    """Control: the listener does see a connection (so 0 below means none was made)."""
    with socket.create_connection(("127.0.0.1", int(tripwire.url.rsplit(":", 1)[1]))):
        pass
    tripwire.close()
    assert tripwire.connections == 1


def offline_env(tripwire: Tripwire) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("WANDB_")}
    for name in ("NO_PROXY", "no_proxy"):
        env.pop(name, None)
    env["WANDB_BASE_URL"] = tripwire.url
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = tripwire.url
    return env


@pytest.mark.slow  # two training jobs: about 45-60 s on 2 cores
def test_sweep_jobs_each_get_an_offline_wandb_run_with_the_summary(
    tmp_path: Path, tripwire: Tripwire
) -> None:
    command = [
        sys.executable,
        "train.py",
        "-m",
        "debug=smoke",
        "logger=wandb",
        f"batching.token_budget={','.join(map(str, BUDGETS))}",
        f"hydra.sweep.dir={tmp_path}",
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=offline_env(tripwire),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    tripwire.close()
    assert tripwire.connections == 0  # nothing tried to reach W&B or any HTTP(S) host
    for job, budget in enumerate(BUDGETS):
        job_dir = tmp_path / str(job)
        summary = json.loads((job_dir / "summary.json").read_text())
        assert summary["token_budget"] == budget
        # One offline run per job, inside that job's directory (none online, none shared).
        (run_dir,) = (job_dir / "wandb").glob("offline-run-*")
        assert not list((job_dir / "wandb").glob("run-*"))
        (log,) = run_dir.glob("run-*.wandb")
        wandb_summary, exit_code = replay_summary(log)
        assert exit_code == 0  # the run was finished, not cut off at interpreter exit
        for name in FIGURES:
            assert wandb_summary[name] == pytest.approx(summary[name], rel=1e-12), name
        # Each figure once: no second copy as a summary/<name> metric.
        assert [k for k in wandb_summary if k.startswith("summary/")] == []
        # Named after the experiment (the default one, sharegpt_odb) and the overrides.
        expected = f"sharegpt_odb batching.token_budget={budget},debug=smoke,logger=wandb"
        assert replay_run_name(log) == expected
        assert wandb_summary["emitted_samples"] == 64  # debug=smoke: 80 records, 16 val
    # The two jobs' runs are distinct W&B runs.
    run_ids = {p.name.rsplit("-", 1)[1] for p in tmp_path.glob("*/wandb/offline-run-*")}
    assert len(run_ids) == len(BUDGETS)
