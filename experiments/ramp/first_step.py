"""Seconds from iterating an ``ODBLoader`` to its first batch, the ramp off and on.

The data path a training run takes: ShareGPT V3 whole conversations (``load_source``),
the Qwen2.5 ChatML template and BPE (``ChatDataset``, ``max_seq_len`` 4,096) in
``--workers`` worker processes, one rank, default batching settings except the token
budget; the clock runs from ``next(iter(loader))`` (the loader's processes forked, the
window filled, the first round planned and collated) to the batch. Runs interleaved
(off, on, one budget, off, ...; the last a window of one budget without the ramp,
which shows the start-up the others share), medians over ``--repeats``; the clock is
``time.perf_counter``.

    python -m experiments.ramp.first_step [--workers 2] [--repeats 3] [--budget 16384]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from experiments.common import results_meta
from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import ChatDataset, load_tokenizer
from odb_lightning.data.sources import load_source
from odb_lightning.runtime import ODBLoader

HERE = Path(__file__).resolve().parent
SETTINGS = {
    "off": {"ramp_budgets": None},
    "on": {"ramp_budgets": 2},
    # A window of one budget: start-up (forks, each worker's tokenizer) plus ~1 budget.
    "one_budget": {"window_budgets": 1, "ramp_budgets": None},
}


def first_batch(dataset: ChatDataset, config: BatchingConfig, workers: int) -> dict:
    """Seconds to the first batch and the samples it waited for, one fresh loader."""
    with ODBLoader(dataset, config, num_workers=workers, multiprocessing_context="fork") as loader:
        started = time.perf_counter()
        batch = next(iter(loader))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "first_batch_samples": batch.meta.local_samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=int, default=16384)
    args = parser.parse_args()
    records = load_source("sharegpt").records
    dataset = ChatDataset(records, load_tokenizer("qwen2.5"), max_seq_len=4096)
    timings: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, knobs in SETTINGS.items():
            config = BatchingConfig.of(token_budget=args.budget, **knobs)
            run = first_batch(dataset, config, args.workers)
            timings[name].append(run["seconds"])
            print(name, f"{run['seconds']:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    result = {
        "meta": results_meta(workers=args.workers, token_budget=args.budget),
        "records": len(records),
        "seconds": timings,
        "median_s": medians,
        "off_over_on": medians["off"] / medians["on"],
    }
    (HERE / "first_step.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_s"]), f"ratio {result['off_over_on']:.1f}")


if __name__ == "__main__":
    main()
