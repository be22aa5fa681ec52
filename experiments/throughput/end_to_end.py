"""End to end at a scale the window ramp does not dominate: ODB vs the reference package
vs fixed batches, at one and two ranks.

    .venv/bin/python -m experiments.throughput.end_to_end --lock /tmp/odb_bench.lock

The one-rank study (``run.py``) and the two-rank study (``two_ranks.py``) time epochs of
64-352 samples, one window (256 samples) or less, so the window ramp splits their
grouping. Here every rank's epoch holds ``--windows`` (20) windows of ``--window`` samples
(our ``outstanding_depth``, the reference's ``buffer_size``): the same loops, arms, checks
and clock as those two studies (``run.train_epoch`` at one rank, ``two_ranks.run_job`` at
two; every run must train exactly the benchmark's samples and tokens; the reference is
timed doing only its own work, with our pad collate), on one regime, with a smaller body
than ``model=cpu_bench`` so that the study fits an hour of two shared cores.

Arms at one rank: ``standard_bs8`` (fixed batches of 8), ``odb`` (our ``ODBLoader``, the
defaults with the study's budget and depth; rows cost their tokens, as the reference's
budget counts them and the other two studies ran), ``odb_model_cost`` (the same with the
rows costed by the model's own FLOPs, ``batching.rows.attention_weight`` as ``train.py``
resolves its default from the model), ``reference`` (``odb.ODBDataLoader`` of
``online-dynamic-batching``). At two ranks: ``standard``,
``odb`` (grouping across ranks on, the default), ``odb_model_cost`` (the same, rows
costed as at one rank), ``odb_per_rank`` (``cross_rank_grouping=false``), ``reference``
(on a seeded ``DistributedSampler``, as in ``two_ranks.py``). Each rank trains as many
samples as the one-rank run. Per repeat the
arms run interleaved, the order rotated; the ``--once`` arms (the standard arms, the
slowest, and ``odb_model_cost``) run in the first repeat only. Figures are medians, ratios
the median of the per-repeat ratios. Writes ``end_to_end.json`` next to this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from experiments.common import bench_lock, results_meta
from experiments.cpu_bench import PRESET, build_cpu_bench, model_preset
from experiments.throughput import two_ranks
from experiments.throughput.run import check_coverage, ratio_text, train_epoch
from experiments.throughput.throughput_arms import ArmSettings, load_bench_data, make_arm
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.simulate import simulate_dealt_epoch

HERE = Path(__file__).resolve().parent
BODY = (
    "model.architecture.hidden_size=64",
    "model.architecture.intermediate_size=256",
    "model.architecture.num_attention_heads=2",
    "model.architecture.token_id_fold=1024",
)
"""``cpu_bench`` at half its width (2 layers of 64, 2/1 heads, MLP 256, ids folded
modulo 1,024): about 3x its tokens per second on one thread."""
ONE_RANK = ("standard_bs8", "odb", "odb_model_cost", "reference")
TWO_RANKS = ("standard", "odb", "odb_model_cost", "odb_per_rank", "reference")
STANDARD = frozenset({"standard_bs8", "standard"})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", default="mix", help="a regime of throughput_arms.REGIMES")
    parser.add_argument(
        "--window", type=int, default=48,
        help="window in samples: our outstanding_depth and the reference's buffer_size",
    )  # fmt: skip
    parser.add_argument("--windows", type=int, default=20, help="windows per rank and epoch")
    parser.add_argument("--token-budget", type=int, default=8192)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--once", default="standard_bs8,standard,odb_model_cost",
        help="arms timed in the first repeat only (the slowest, and the model-cost variant)",
    )  # fmt: skip
    parser.add_argument("--one-rank", default=",".join(ONE_RANK), help="arms at one rank")
    parser.add_argument("--two-ranks", default=",".join(TWO_RANKS), help="arms at two ranks")
    parser.add_argument("--body", default=",".join(BODY), help="Hydra overrides of cpu_bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per two-rank job")
    parser.add_argument("--lock", type=Path, help="flock this file around each timed run")
    parser.add_argument("--out", type=Path, default=HERE / "end_to_end.json")
    parser.add_argument(
        "--predict-only", action="store_true",
        help="print the sizes and the simulator's steps; no training",
    )  # fmt: skip
    parser.add_argument(
        "--table", action="store_true", help="print --out's results as Markdown; no training"
    )
    return parser.parse_args()


def _ratios(row: dict[str, Any], base: str) -> str:
    per_repeat = row.get(f"vs_{base}_per_repeat") or []
    if not per_repeat:
        return "-"
    median = f"{row[f'vs_{base}']:.2f}x"
    return (
        median
        if len(per_repeat) == 1
        else f"{median} ({', '.join(f'{r:.2f}' for r in per_repeat)})"
    )


def markdown_table(report: dict[str, Any]) -> str:
    """The study's table: per world and arm the medians, the simulator's steps and the
    ratios to the reference and to standard (per repeat in brackets)."""
    lines = [
        "| ranks | arm | repeats | samples/s | real tok/s | steps (simulator) | padding eff. "
        "| utilization | vs reference | vs standard | loop samples/CPU s | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for world, ranks in (("one_rank", 1), ("two_ranks", 2)):
        for arm, row in report[world].items():
            predicted = report["predicted"][world].get(arm, {}).get("steps", "-")
            utilization = f"{row['utilization']:.3f}" if "utilization" in row else "-"
            loads = ", ".join(f"{value:.1f}" for value in row["load_average_1min"])
            per_cpu = "-"
            if "cpu_share" in row:  # one rank: the training loop's own CPU time
                jobs = report["jobs"][world][arm].values()
                samples = report["meta"]["samples"][world]
                per_cpu = statistics.median(
                    samples / (job["wall_s"] * job["cpu_share"]) for job in jobs
                )
                per_cpu = f"{per_cpu:.2f}"
            lines.append(
                f"| {ranks} | {arm} | {row['repeats']} | {row['samples_per_s']:.2f} | "
                f"{row['real_tokens_per_s']:,.0f} | {row['steps']} ({predicted}) | "
                f"{row['padding_efficiency']:.3f} | {utilization} | "
                f"{_ratios(row, 'reference')} | {_ratios(row, 'standard')} | {per_cpu} | "
                f"{loads} |"
            )
    return "\n".join(lines)


def model_attention_weight(body: tuple[str, ...]) -> float:
    """The body's ``batching.rows.attention_weight``, as ``train.py`` resolves ``null``."""
    import hydra

    architecture = hydra.utils.instantiate(model_preset(PRESET, body).architecture)
    return architecture.attention_weight()


def one_rank_predictions(
    lengths: list[int], settings: ArmSettings, odb_only: bool = False
) -> dict[str, Any]:
    """The simulator's steps for odb with and without the ramp, and the reference's own
    grouping, on the one-rank run's orders (``odb_only``: odb's alone)."""
    from experiments.sync_efficiency.reference import measure_reference

    order = [lengths[i] for i in epoch_permutation(len(lengths), settings.seed, 0)]
    predicted = {}
    for arm, knobs in (("odb", {}), ("odb_no_ramp", {"ramp_budgets": None})):
        config = BatchingConfig.of(
            mode="odb",
            token_budget=settings.token_budget,
            seed=settings.seed,
            outstanding_depth=settings.outstanding_depth,
            attention_weight=settings.attention_weight,
            **knobs,
        )
        result = simulate_dealt_epoch(order, 1, config)
        predicted[arm] = {"steps": len(result.steps[0]), "utilization": result.sync.utilization}
    if odb_only:
        return predicted["odb"]
    generator = torch.Generator().manual_seed(settings.seed)  # the reference's shuffle
    shuffled = [lengths[i] for i in torch.randperm(len(lengths), generator=generator).tolist()]
    reference = measure_reference([shuffled], settings.token_budget, settings.outstanding_depth)
    predicted["reference"] = {
        "steps": reference["steps_per_rank"],
        "utilization": reference["utilization"],
    }
    return predicted


def rotated(arms: list[str], repeat: int, once: set[str]) -> list[str]:
    """This repeat's arms, the order rotated per repeat (``once``: in the first only)."""
    arms = [a for a in arms if a not in once or repeat == 0]
    shift = repeat % len(arms) if arms else 0
    return arms[shift:] + arms[:shift]


def one_rank_job(record: Any) -> dict[str, Any]:
    return {
        "wall_s": record.wall_s,
        "samples_per_s": record.samples / record.wall_s,
        "real_tokens_per_s": record.real_tokens / record.wall_s,
        "steps": record.steps,
        "padding_efficiency": record.real_tokens / record.padded_tokens,
        "loader_wait_s": record.loader_wait_s,
        "cpu_share": record.cpu_s / record.wall_s,
        "load_average": record.load_average,
    }


def summarize(jobs: dict[str, dict[int, dict]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Medians per arm, and per-repeat ratios to the reference and to standard."""
    jobs = {arm: by_repeat for arm, by_repeat in jobs.items() if by_repeat}  # arms timed so far
    arms: dict[str, Any] = {}
    standard = next((a for a in jobs if a in STANDARD), None)
    for arm, by_repeat in jobs.items():
        runs = list(by_repeat.values())
        row = {key: statistics.median(job[key] for job in runs) for key in keys}
        row["steps"] = runs[0]["steps"]
        row["repeats"] = len(runs)
        row["load_average_1min"] = [job["load_average"][0] for job in runs]
        for base in ("reference", standard):
            if base is None or base not in jobs:
                continue
            ratios = [
                job["samples_per_s"] / jobs[base][repeat]["samples_per_s"]
                for repeat, job in by_repeat.items()
                if repeat in jobs[base]
            ]
            name = "standard" if base in STANDARD else base
            row[f"vs_{name}"] = statistics.median(ratios) if ratios else None
            row[f"vs_{name}_per_repeat"] = ratios
        arms[arm] = row
    return arms


def main() -> None:
    args = parse_args()
    if args.table:
        print(markdown_table(json.loads(args.out.read_text())))
        return
    torch.set_num_threads(1)
    body = tuple(filter(None, args.body.split(",")))
    one_arms = list(filter(None, args.one_rank.split(",")))  # "": no arm at that size
    two_arms = list(filter(None, args.two_ranks.split(",")))
    once = set(filter(None, args.once.split(",")))
    from odb_lightning.data import load_tokenizer

    weight = model_attention_weight(body)
    pad_id = load_tokenizer().pad_id
    per_rank = args.window * args.windows
    one = ArmSettings(
        token_budget=args.token_budget,
        outstanding_depth=args.window,
        num_workers=2,
        max_seq_len=args.max_seq_len,
        pad_id=pad_id,
        seed=args.seed,
    )
    model_cost = replace(one, attention_weight=weight)
    two = two_ranks.Settings(
        token_budget=args.token_budget,
        outstanding_depth=args.window,
        max_seq_len=args.max_seq_len,
        seed=args.seed,
        lr=args.lr,
        pad_id=pad_id,
        architecture=body,
    )
    two_model_cost = replace(two, attention_weight=weight)
    load_before = list(os.getloadavg())
    started = time.perf_counter()
    with bench_lock(args.lock):  # CPU-heavy (tokenization): kept off other timed runs
        data2 = load_bench_data(args.regime, 2 * per_rank, 2000, args.max_seq_len, args.seed)
        data1 = data2.head(per_rank)
        predicted = {
            "one_rank": one_rank_predictions(data1.lengths, one)
            | {"odb_model_cost": one_rank_predictions(data1.lengths, model_cost, odb_only=True)},
            "two_ranks": two_ranks.predictions(data2, two)
            | {"odb_model_cost": two_ranks.predictions(data2, two_model_cost)["odb"]},
        }
    p = data2.population
    print(
        f"{args.regime}: regime mean {p.mean:.0f}, CV {p.cv:.2f}, p99 {p.p99}; window "
        f"{args.window} samples (~{args.window * p.mean / args.token_budget:.1f} budgets of "
        f"{args.token_budget:,}), {args.windows} windows per rank: {per_rank} samples "
        f"({sum(data1.lengths):,} tokens) at one rank, {2 * per_rank} "
        f"({sum(data2.lengths):,}) at two; attention_weight {weight:.3g}",
        flush=True,
    )
    for world, table in predicted.items():
        print(world, ", ".join(
            f"{arm} {row['steps']} steps util {row['utilization']:.3f}"
            for arm, row in table.items()
        ), flush=True)  # fmt: skip
    if args.predict_only:
        return
    warm = build_cpu_bench(args.seed, body)  # one untimed step: no one-off cost in an arm
    ids = torch.arange(2048).remainder(1024).unsqueeze(0)
    warm({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})[0].backward()
    jobs1: dict[str, dict[int, dict]] = {a: {} for a in one_arms}
    jobs2: dict[str, dict[int, dict]] = {a: {} for a in two_arms}

    def write_report(repeats_started: int) -> dict[str, Any]:
        """The medians and ratios of the runs so far, written to ``--out`` after each run
        (a study cut short keeps what it measured)."""
        rates = ("samples_per_s", "real_tokens_per_s", "wall_s", "padding_efficiency")
        report = {
            "one_rank": summarize(jobs1, rates + ("loader_wait_s", "cpu_share")),
            "two_ranks": summarize(jobs2, rates + ("utilization", "measured_sync_efficiency")),
            "predicted": predicted,
            "jobs": {"one_rank": jobs1, "two_ranks": jobs2},
            "meta": results_meta(
                regime=args.regime,
                regime_lengths=asdict(p),
                window_samples=args.window,
                windows_per_rank=args.windows,
                samples={"one_rank": len(data1.lengths), "two_ranks": len(data2.lengths)},
                tokens={"one_rank": sum(data1.lengths), "two_ranks": sum(data2.lengths)},
                token_budget=args.token_budget,
                attention_weight=weight,
                model=f"conf/model/cpu_bench.yaml with {', '.join(body)}",
                repeats_started=repeats_started,
                first_repeat_only=sorted(once),
                one_rank_settings=asdict(one),
                two_rank_settings=asdict(two),
                intra_op_threads=1,
                wall_s=time.perf_counter() - started,
                load_average_before=load_before,
                load_average_after=list(os.getloadavg()),
            ),
        }
        for arm, row in report["two_ranks"].items():
            first = next(iter(jobs2[arm].values()))
            row["moved_samples"], row["moved_bytes"] = first["moved_samples"], first["moved_bytes"]
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        return report

    for repeat in range(args.repeats):
        for arm in rotated(one_arms, repeat, once):
            model = build_cpu_bench(args.seed, body)
            with bench_lock(args.lock):
                start = (
                    make_arm("odb", data1, model_cost)
                    if arm == "odb_model_cost"
                    else make_arm(arm, data1, one)
                )
                record = train_epoch(model, start, args.lr)
            check_coverage(data1, arm, record)
            job = jobs1[arm][repeat] = one_rank_job(record)
            print(
                f"repeat {repeat} 1 rank  {arm:13s} {job['samples_per_s']:6.2f} samples/s "
                f"{job['steps']:4d} steps  {job['wall_s']:6.1f} s  eff "
                f"{job['padding_efficiency']:.3f}  cpu {job['cpu_share']:.2f}  load "
                f"{record.load_average[0]:.2f}",
                flush=True,
            )
            report = write_report(repeat + 1)
        for arm in rotated(two_arms, repeat, once):
            with bench_lock(args.lock):
                ranks = (
                    two_ranks.run_job("odb", data2, two_model_cost, args.timeout_s)
                    if arm == "odb_model_cost"
                    else two_ranks.run_job(arm, data2, two, args.timeout_s)
                )
            job = two_ranks.job_figures(ranks, data2)
            job["load_average"] = list(os.getloadavg())
            jobs2[arm][repeat] = job
            print(
                f"repeat {repeat} 2 ranks {arm:13s} {job['samples_per_s']:6.2f} samples/s "
                f"{job['steps']:4d} steps  {job['wall_s']:6.1f} s  util "
                f"{job['utilization']:.3f}  sync {job['measured_sync_efficiency']:.3f}  moved "
                f"{job['moved_samples']}  load {job['load_average'][0]:.2f}",
                flush=True,
            )
            report = write_report(repeat + 1)
    for world in ("one_rank", "two_ranks"):
        print(world)
        for arm, row in report[world].items():
            print(
                f"  {arm:13s} {row['samples_per_s']:6.2f} samples/s  {row['steps']:4d} steps  "
                f"eff {row['padding_efficiency']:.3f}  vs ref {ratio_text(row.get('vs_reference'))}"
                f" {[round(r, 3) for r in row.get('vs_reference_per_repeat', [])]}  vs std "
                f"{ratio_text(row.get('vs_standard'))}"
            )


if __name__ == "__main__":
    main()
