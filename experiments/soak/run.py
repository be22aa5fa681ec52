"""Soak: many short epochs of the ODB loader on 2 ranks with 2 workers each; open file
descriptors, child processes and memory must stay bounded (no leak per epoch).

Each rank is a real process in a gloo default group (the multi-rank harness of
``testing.harness.ranks``, which the runtime tests use too) running ``ODBLoader``
over ShareGPT first exchanges, tokenized with the Qwen2.5 BPE in the workers. Per epoch every rank
samples, after its first batch and after the epoch: its open fds (``/proc/<pid>/fd``),
its live descendants (workers and collate process), its RSS, the largest RSS among its
descendants, and the PSS of the whole process tree. Both process lifetimes are soaked:
``persistent_workers=False`` (processes and the metadata channel are rebuilt every
epoch, the path where a leak would show first) and ``True`` (the training default).

    .venv/bin/python -m experiments.soak.run            # 30 epochs, ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from experiments.common import results_meta
from odb_lightning.data import ChatDataset, QwenTokenizer, load_source
from testing.harness.ranks import RankJob, run_ranks

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
LOADER = {
    "token_budget": 4096,
    "outstanding_depth": 64,
    "max_steps_per_round": 8,
    "shard_dealing": "fixed",  # its measured settings
    "num_workers": 2,
    "multiprocessing_context": "fork",
    "max_seq_len": 2048,
}


def soak(dataset: ChatDataset, epochs: int, persistent: bool) -> dict:
    job = RankJob(
        dataset,  # type: ignore[arg-type]
        {**LOADER, "persistent_workers": persistent},
        epochs=epochs,
        probe_resources=True,
    )
    started = time.monotonic()
    outcome = run_ranks(job, world_size=2, timeout_s=60 * epochs)
    elapsed_s = time.monotonic() - started
    if outcome.errors or len(outcome.ok) != 2:
        raise RuntimeError(f"soak run failed: {outcome.errors}")
    ranks = {}
    for rank, records in sorted(outcome.ok.items()):
        ranks[rank] = [
            {
                "epoch": epoch,
                "steps": len(record["steps"]),
                "emitted": record["stats"].emitted_samples,
                **{f"mid_{k}": v for k, v in record["resources"]["mid_epoch"].items()},
                **{f"end_{k}": v for k, v in record["resources"]["epoch_end"].items()},
            }
            for epoch, record in enumerate(records)
        ]
    return {"persistent_workers": persistent, "elapsed_s": round(elapsed_s, 1), "ranks": ranks}


def summarize(run: dict) -> dict:
    """First and last epoch, and the spread over epochs, per rank."""
    keys = ["mid_open_fds", "end_open_fds", "mid_children", "end_children"]
    memory = ["mid_rss_bytes", "mid_max_child_rss_bytes", "mid_tree_pss_bytes"]
    summary = {}
    for rank, epochs in run["ranks"].items():
        first, last = epochs[0], epochs[-1]
        row = {k: [first[k], last[k], max(e[k] for e in epochs)] for k in keys}
        row |= {
            k.replace("_bytes", "_mib"): [round(first[k] / MIB), round(last[k] / MIB),
                                          round(max(e[k] for e in epochs) / MIB)]
            for k in memory
        }  # fmt: skip
        summary[rank] = row
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    records = load_source("sharegpt", regime="first_exchange", max_samples=args.samples).records
    dataset = ChatDataset(records, QwenTokenizer(), max_seq_len=LOADER["max_seq_len"])
    runs = [soak(dataset, args.epochs, persistent) for persistent in (False, True)]
    results = {
        "meta": results_meta(fd_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
        "epochs": args.epochs,
        "samples": args.samples,
        "loader": LOADER,
        "summary_format": "[epoch 1, epoch N, max over epochs]",
        "summary": {f"persistent_workers={r['persistent_workers']}": summarize(r) for r in runs},
        "runs": runs,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
