"""Training throughput of every batching mode vs fixed batches and vs the reference package.

One process, one training loop for every arm: the same ``model=cpu_bench`` stand-in
(body-dominated FLOPs, token ids folded modulo 2,048, real Qwen2.5 tokens and lengths),
the same AdamW, gradient clipping and exact token-weighted loss, the same samples, token
budget and window depth. Per regime the arms run interleaved, ``--repeats`` times; the
figures are medians, the ratios medians of the per-repeat ratios. Run from the repository
root (see README.md next to this file):

    .venv/bin/python -m experiments.throughput.run --lock /tmp/odb_bench.lock

Writes ``results.json`` and ``throughput.png`` next to this script.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from experiments.common import bench_lock, results_meta
from experiments.cpu_bench import build_cpu_bench
from experiments.throughput.throughput_arms import (
    ARMS,
    IGNORE_INDEX,
    REGIMES,
    ArmSettings,
    BenchData,
    load_bench_data,
    make_arm,
)
from experiments.throughput.throughput_report import (
    flop_model,
    plot_results,
    summarize,
    summarize_grouping,
)
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.loss_weights import rank_loss_scale
from odb_lightning.lit.data.planned_mode import epoch_plan
from odb_lightning.lit.model.module import CausalLMModule

HERE = Path(__file__).resolve().parent
# Samples per regime: about the same compute per regime (more of the short ones).
DEFAULT_SAMPLES = {"whole": 64, "first_exchange": 176, "mix": 96, "chitchat": 112}


@dataclass
class EpochRecord:
    """What one arm did in one epoch, counted from the model inputs it received."""

    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time (the training loop; loaders are children)
    loader_wait_s: float = 0.0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    loss_tokens: int = 0
    steps: int = 0
    load_average: list[float] = field(default_factory=list)
    # Per step: (rows, row length, loss tokens), for the FLOP model.
    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)


def count_inputs(inputs: dict[str, Any]) -> tuple[int, int, int, int]:
    """Samples, real tokens, rows and row length of one step's model inputs."""
    rows, row_length = inputs["input_ids"].shape
    if "cu_seqlens" in inputs:  # a packed row: every token is real
        return int(inputs["cu_seqlens"].numel() - 1), rows * row_length, rows, row_length
    return rows, int(inputs["attention_mask"].sum()), rows, row_length


def add_step(record: EpochRecord, inputs: dict[str, Any], num_loss_tokens: int) -> None:
    samples, real, rows, row_length = count_inputs(inputs)
    record.samples += samples
    record.real_tokens += real
    record.padded_tokens += rows * row_length
    record.loss_tokens += num_loss_tokens
    record.steps += 1
    record.shapes.append((rows, row_length, num_loss_tokens))


def train_step(model: CausalLMModule, optimizer: torch.optim.Optimizer, inputs: Any) -> int:
    """Forward, token-weighted backward, clipping and AdamW of one step; its supervised
    tokens. One process: W = 1, N = this step's supervised tokens (the exact mean)."""
    loss_sum, num_loss_tokens = model(inputs)
    (loss_sum * rank_loss_scale(1, num_loss_tokens)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return num_loss_tokens


def train_epoch(
    model: CausalLMModule, start: Callable[[], Iterator[dict[str, Any]]], lr: float
) -> EpochRecord:
    """One epoch of the arm's batches: forward, token-weighted backward, clip, AdamW step.

    The clock runs from building the loader (its processes start inside) to the last
    optimizer step, so start-up and window fill are paid by every arm.
    """
    model.configure_model()  # builds the model once (a no-op when built)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    record = EpochRecord(load_average=list(os.getloadavg()))
    started, cpu_started = time.perf_counter(), time.process_time()
    batches = start()
    while True:
        waited = time.perf_counter()
        inputs = next(batches, None)
        record.loader_wait_s += time.perf_counter() - waited
        if inputs is None:
            break
        step_started = time.perf_counter()
        num_loss_tokens = train_step(model, optimizer, inputs)
        add_step(record, inputs, num_loss_tokens)
        record.step_s.append(time.perf_counter() - step_started)
    record.wall_s = time.perf_counter() - started
    record.cpu_s = time.process_time() - cpu_started
    record.load_average += list(os.getloadavg())
    return record


def replay_epoch(start: Callable[[], Iterator[dict[str, Any]]]) -> EpochRecord:
    """One epoch of an arm's batches without the model: the steps and shapes it forms."""
    record = EpochRecord()
    started = time.perf_counter()
    for inputs in start():
        add_step(record, inputs, int((inputs["labels"][..., 1:] != IGNORE_INDEX).sum()))
    record.wall_s = time.perf_counter() - started
    return record


def plan_record(batches: list[list[int]], data: BenchData) -> EpochRecord:
    """The record a planned loader would produce for ``batches`` (no loader run)."""
    record = EpochRecord()
    for batch in batches:
        longest = max(data.lengths[i] for i in batch)
        record.samples += len(batch)
        record.real_tokens += sum(data.lengths[i] for i in batch)
        record.padded_tokens += len(batch) * longest
        record.loss_tokens += sum(data.loss_tokens[i] for i in batch)
        record.steps += 1
        record.shapes.append((len(batch), longest, sum(data.loss_tokens[i] for i in batch)))
    return record


def group_whole_regime(
    regime: str, settings: ArmSettings, args: argparse.Namespace
) -> tuple[dict[str, EpochRecord], BenchData]:
    """Every record of the regime, one epoch, grouped but not trained: the online loaders
    run for real; standard and oracle are their plans (which their loader executes)."""
    full = load_bench_data(regime, None, None, args.max_seq_len, args.seed)
    records = {arm: replay_epoch(make_arm(arm, full, settings)) for arm in ("odb", "reference")}
    for arm, mode, knobs in (("standard_bs8", "standard", {"batch_size": 8}),
                             ("oracle", "oracle", {})):  # fmt: skip
        config = BatchingConfig.of(
            mode=mode, token_budget=settings.token_budget, seed=settings.seed, **knobs
        )
        plan = epoch_plan(full.lengths, config, len(full.lengths))(0)
        records[arm] = plan_record(plan, full)
    for arm, record in records.items():
        check_coverage(full, arm, record)
    return records, full


def warm_up(seed: int) -> None:
    """One untimed step, so the first timed arm pays no one-off allocation cost."""
    model = build_cpu_bench(seed)
    ids = torch.arange(2048).remainder(2048).unsqueeze(0)
    loss_sum, _ = model({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    loss_sum.backward()


def check_coverage(data: BenchData, arm: str, record: EpochRecord) -> None:
    """Every arm must train on exactly the benchmark's samples and tokens."""
    expected = (len(data.lengths), sum(data.lengths))
    got = (record.samples, record.real_tokens)
    if got != expected:
        raise RuntimeError(
            f"{data.source.regime}/{arm}: (samples, real tokens) {got} != {expected}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--samples",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_SAMPLES.items()),
        help="samples per regime, e.g. whole=128,mix=192",
    )
    parser.add_argument("--population", type=int, default=2000, help="records for the p99")
    parser.add_argument(
        "--packed-fraction", type=float, default=0.5,
        help="share of the samples odb_packed trains on (its dense block mask is slow on CPU)",
    )  # fmt: skip
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--outstanding-depth", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="intra-op threads of the training loop (1: stable on a shared machine)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument(
        "--whole-regime", default=",".join(REGIMES),
        help="regimes whose every record is also grouped (no model) by odb and the reference",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=HERE, help="results.json goes here")
    parser.add_argument("--lock", type=Path, help="flock this file around each timed run")
    return parser.parse_args()


def ratio_text(value: float | None) -> str:
    """``1.23x``, or ``-`` where the run has no arm to compare with."""
    return "-" if value is None else f"{value:.2f}x"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    regimes = args.regimes.split(",")
    arms = args.arms.split(",")
    samples = {k: int(v) for k, v in (item.split("=") for item in args.samples.split(","))}
    from odb_lightning.data import load_tokenizer

    settings = ArmSettings(
        token_budget=args.token_budget,
        outstanding_depth=args.outstanding_depth,
        num_workers=args.num_workers,
        max_seq_len=args.max_seq_len,
        pad_id=load_tokenizer().pad_id,
        seed=args.seed,
    )
    data = {
        r: load_bench_data(r, samples[r], args.population, args.max_seq_len, args.seed)
        for r in regimes
    }
    for regime, bench in data.items():
        p = bench.population
        print(
            f"{regime}: {len(bench.lengths)} samples, {sum(bench.lengths):,} tokens; regime "
            f"mean {p.mean:.0f}, CV {p.cv:.2f}, p99 {p.p99} ({p.count} records)",
            flush=True,
        )
    warm_up(args.seed)
    runs: dict[str, dict[str, list[EpochRecord]]] = {r: {a: [] for a in arms} for r in regimes}
    load_before = list(os.getloadavg())
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for regime in regimes:
            # Interleaved, and rotated per repeat, so drifting load hits every arm alike.
            for arm in arms[repeat % len(arms) :] + arms[: repeat % len(arms)]:
                bench = data[regime]
                if arm == "odb_packed":
                    bench = bench.head(max(1, round(args.packed_fraction * len(bench.lengths))))
                model = build_cpu_bench(args.seed)
                with bench_lock(args.lock):
                    record = train_epoch(model, make_arm(arm, bench, settings), args.lr)
                check_coverage(bench, arm, record)
                runs[regime][arm].append(record)
                print(
                    f"repeat {repeat} {regime:14s} {arm:13s} {record.samples / record.wall_s:7.2f}"
                    f" samples/s  {record.steps:4d} steps  {record.wall_s:6.1f} s  "
                    f"wait {record.loader_wait_s:5.1f} s  load {record.load_average[0]:.2f}",
                    flush=True,
                )
    timed_s = time.perf_counter() - started
    config = build_cpu_bench(args.seed).model.config
    grouping = {}
    for regime in filter(None, args.whole_regime.split(",")):
        with bench_lock(args.lock):  # CPU-heavy (tokenization): keep it off timed runs
            records, full = group_whole_regime(regime, settings, args)
        grouping[regime] = summarize_grouping(records, full, flop_model(config), args.token_budget)
        print(f"whole {regime}: " + ", ".join(
            f"{arm} {row['steps']} steps eff {row['padding_efficiency']:.3f}"
            for arm, row in grouping[regime]["arms"].items()
        ), flush=True)  # fmt: skip
    report = {
        "regimes": {
            r: summarize(runs[r], data[r], flop_model(config), args.token_budget) for r in regimes
        },
        "whole_regime_grouping": grouping,
        "meta": results_meta(
            intra_op_threads=torch.get_num_threads(),
            repeats=args.repeats,
            timed_wall_s=timed_s,
            wall_s=time.perf_counter() - started,
            load_average_before=load_before,
            load_average_after=list(os.getloadavg()),
            settings=asdict(settings),
            model="conf/model/cpu_bench.yaml (token ids folded modulo token_id_fold)",
            flops_per_token=flop_model(config).describe(),
            samples={r: len(data[r].lengths) for r in regimes},
            packed_fraction=args.packed_fraction,
            regime_lengths={r: asdict(data[r].population) for r in regimes},
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_results(report, args.out / "throughput.png")
    for regime, table in report["regimes"].items():
        print(regime)
        for arm, row in table["arms"].items():
            print(
                f"  {arm:13s} {row['samples_per_s']:7.2f} samples/s {row['real_tokens_per_s']:8.0f}"
                f" tok/s  eff {row['padding_efficiency']:.3f}  steps {row['steps']:4d}  "
                f"vs std {ratio_text(row['vs_standard'])} (pred "
                f"{ratio_text(row.get('predicted_vs_standard'))})  "
                f"vs ref {ratio_text(row['vs_reference'])}"
            )


if __name__ == "__main__":
    main()
