"""Where an arm's time goes: its loader alone, and training on its batches alone.

    .venv/bin/python -m experiments.throughput.profile_step --lock /tmp/odb_bench.lock

Per regime of ``run.py`` and arm (default ``odb``, ``odb_no_ramp``, ``reference``): the
arm's loader runs one epoch without the model (**loader s**: from building it to its last
batch, workers included), and its batches, kept, are then trained without a loader (**compute
s**: forward, token-weighted backward, clipping and AdamW on the same ``cpu_bench`` model,
one intra-op thread, as ``run.py``), each step timed. Arms interleaved and rotated,
``--repeats`` times; medians. Shows whether a gap between two arms lies in the loader or
in the steps the loader formed, and which steps cost what (each step's rows, row length and
seconds in ``profile.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from experiments.common import bench_lock, results_meta
from experiments.cpu_bench import build_cpu_bench
from experiments.throughput.run import DEFAULT_SAMPLES, train_step
from experiments.throughput.throughput_arms import (
    REGIMES,
    ArmSettings,
    load_bench_data,
    make_arm,
)

HERE = Path(__file__).resolve().parent


def loader_epoch(start) -> tuple[float, list[dict[str, Any]]]:
    """Seconds of one epoch of the arm's loader alone, and its batches."""
    started = time.perf_counter()
    batches = [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in start()
    ]
    return time.perf_counter() - started, batches


def compute_epoch(batches: list[dict[str, Any]], seed: int, lr: float) -> list[float]:
    """Seconds of each training step on ``batches`` (no loader)."""
    model = build_cpu_bench(seed)
    model.configure_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    times = []
    for inputs in batches:
        started = time.perf_counter()
        train_step(model, optimizer, inputs)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--arms", default="odb,odb_no_ramp,reference")
    parser.add_argument("--lock", type=Path)
    parser.add_argument("--out", type=Path, default=HERE / "profile.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from odb_lightning.data import load_tokenizer

    settings = ArmSettings(
        token_budget=16384,
        outstanding_depth=256,
        num_workers=2,
        max_seq_len=4096,
        pad_id=load_tokenizer().pad_id,
        seed=0,
    )
    regimes, arms = args.regimes.split(","), args.arms.split(",")
    with bench_lock(args.lock):
        data = {r: load_bench_data(r, DEFAULT_SAMPLES[r], 2000, 4096, 0) for r in regimes}
    runs: dict[str, dict[str, list[dict]]] = {r: {a: [] for a in arms} for r in regimes}
    for repeat in range(args.repeats):
        for regime in regimes:
            for arm in arms[repeat % len(arms) :] + arms[: repeat % len(arms)]:
                with bench_lock(args.lock):
                    loader_s, batches = loader_epoch(make_arm(arm, data[regime], settings))
                    steps = compute_epoch(batches, settings.seed, 3e-4)
                shapes = [tuple(b["input_ids"].shape) for b in batches]
                runs[regime][arm].append(
                    {
                        "loader_s": loader_s,
                        "compute_s": sum(steps),
                        "step_s": steps,
                        "shapes": shapes,
                    }
                )
                print(
                    f"repeat {repeat} {regime:14s} {arm:12s} loader {loader_s:5.2f} s  compute "
                    f"{sum(steps):6.2f} s  {len(steps)} steps",
                    flush=True,
                )
    report: dict[str, Any] = {}
    for regime, by_arm in runs.items():
        report[regime] = {}
        for arm, jobs in by_arm.items():
            report[regime][arm] = {
                "loader_s": statistics.median(j["loader_s"] for j in jobs),
                "compute_s": statistics.median(j["compute_s"] for j in jobs),
                "steps": len(jobs[0]["shapes"]),
                "shapes": jobs[0]["shapes"],
                "step_s_median": [
                    statistics.median(j["step_s"][i] for j in jobs)
                    for i in range(len(jobs[0]["step_s"]))
                ],
            }
    args.out.write_text(
        json.dumps({"regimes": report, "meta": results_meta(repeats=args.repeats)}, indent=1) + "\n"
    )
    print("| regime | arm | steps | loader s | compute s | reference compute / this |")
    print("|---|---|---|---|---|---|")
    for regime, by_arm in report.items():
        base = by_arm.get("reference", {}).get("compute_s")
        for arm, row in by_arm.items():
            ratio = "-" if not base else f"{base / row['compute_s']:.3f}x"
            print(
                f"| {regime} | {arm} | {row['steps']} | {row['loader_s']:.2f} | "
                f"{row['compute_s']:.2f} | {ratio} |"
            )


if __name__ == "__main__":
    main()
