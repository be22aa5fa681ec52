"""Streamed chat records for the tests: a JSON Lines file of records with
known lengths, a toy tokenizer that turns a record into a sample of that length, and a
2-rank run of ``ODBLoader`` over the stream that may stop mid-epoch and resume."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from odb_lightning.data.stream import ChatStream
from odb_lightning.runtime import ODBLoader
from testing.harness.processes import kill_alive


def write_records(path: Path, lengths: list[int]) -> Path:
    """One record per length: its assistant reply is ``length`` characters long."""
    with path.open("w") as out:
        for i, length in enumerate(lengths):
            messages = [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "x" * length},
            ]
            out.write(json.dumps({"id": f"rec{i}", "messages": messages}) + "\n")
    return path


def seeded_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(2, 300) for _ in range(n)]


class ReplyLengthDataset:
    """Tokenizes a streamed record into a sample as long as its assistant reply (the
    first third unsupervised): the lengths of a stream are known to the test."""

    def __init__(self, num_records: int) -> None:
        self.num_records = num_records

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> Any:
        raise TypeError("a stream has no random access")

    def tokenize_record(self, record: dict, index: int) -> dict[str, torch.Tensor]:
        length = len(record["messages"][-1]["content"])
        input_ids = torch.arange(1, length + 1)
        labels = input_ids.clone()
        labels[: length // 3] = -100
        return {"input_ids": input_ids, "labels": labels}


@dataclass(frozen=True)
class StreamJob:
    """What every rank runs: ``epochs`` epochs over the stream at ``directory``; with
    ``stop_after``, the first run stops after that many steps of epoch 0, saves the
    loader's state, and a new loader resumes from it."""

    directory: str
    loader_kwargs: dict[str, Any]
    epochs: int = 1
    stop_after: int | None = None
    resume_world: dict[str, Any] = field(default_factory=dict)


def _steps(loader: ODBLoader, limit: int | None = None) -> list[list[int]]:
    steps = []
    for batch in loader:
        steps.append(list(batch.meta.sample_ids))
        if limit is not None and len(steps) == limit:
            break
    return steps


def _run(job: StreamJob) -> dict[str, Any]:
    stream = ChatStream(job.directory)
    dataset = ReplyLengthDataset(stream.num_records)
    out: dict[str, Any] = {"epochs": []}
    with ODBLoader(dataset, stream=stream, **job.loader_kwargs) as loader:
        out["part"] = (loader.stream.part.first, loader.stream.part.count)
        if job.stop_after is not None:
            out["before"] = _steps(loader, job.stop_after)
            state = loader.state_dict(consumed_steps=job.stop_after)
            out["state"] = state
        else:
            for epoch in range(job.epochs):
                loader.set_epoch(epoch)
                out["epochs"].append(_steps(loader))
    if job.stop_after is not None:
        with ODBLoader(dataset, stream=stream, **job.loader_kwargs) as loader:
            loader.load_state_dict(out["state"])
            out["after"] = _steps(loader)
    return out


def _rank_main(rank: int, world_size: int, port: int, job: StreamJob, results: Any) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        results.put(("ok", rank, _run(job)))
    except Exception as error:  # reported to the caller, which asserts on it
        results.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        dist.destroy_process_group()


def run_stream_ranks(job: StreamJob, world_size: int = 2, timeout_s: float = 120.0) -> dict:
    """Each rank's result (``part``, ``epochs`` or ``before``/``state``/``after``), or
    raise naming a rank's error; every rank is joined or killed before return."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", __name__])
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    results = context.Queue()
    ranks = [
        context.Process(target=_rank_main, args=(r, world_size, store.port, job, results))
        for r in range(world_size)
    ]
    for process in ranks:
        process.start()
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < world_size:
            try:
                kind, rank, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"ranks did not finish within {timeout_s}s") from None
            if kind == "error":
                raise AssertionError(f"rank {rank} failed: {value}")
            collected[rank] = value
        for process in ranks:
            process.join(max(0.1, deadline - time.monotonic()))
    finally:
        kill_alive(ranks)
    return collected
