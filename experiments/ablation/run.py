"""Ablation over token_budget and outstanding_depth: real CPU training and the simulator.

Training: the points of ``conf/sweep/token_budget.yaml`` and ``conf/sweep/outstanding_depth.yaml``
(read from those files), one ``train.py`` process per point with the override the sweep
holds (the jobs of ``train.py -m sweep=...`` share one process, so their peak memory could
not be told apart), all points of both sweeps interleaved in each repeat (the order rotates
per repeat), ``--repeats`` times; medians, and per-repeat ratios to the base point. Each
run's ``summary.json`` gives throughput, padding efficiency, steps and loader wait share;
peak memory is sampled around the process tree (RSS and PSS, 5 Hz).

Simulator: ``outstanding_depth`` 32..1,024 at 8 and 64 ranks on real ShareGPT lengths
(``experiments/scale/shards.py``), steps per rank against the oracle, and the gap to the
oracle at D = 512 against the shard size.

    python -m experiments.ablation.run [--repeats 3] [--lock FILE] [--parts train,simulator]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
from omegaconf import OmegaConf

from experiments.common import (
    ROOT,
    bench_lock,
    command_line,
    read_summary,
    results_meta,
    train_command,
)
from experiments.cpu_bench import cpu_bench_config
from experiments.scale.shards import (
    draw_lengths,
    oracle_steps_per_rank,
    sharegpt_lengths,
    simulate_figures,
)

HERE = Path(__file__).resolve().parent

SWEEPS = ("token_budget", "outstanding_depth")
# Every point shares these; a sweep overrides its own key. max_seq_len 2048 keeps every
# budget of the sweep valid (max_seq_len <= token_budget).
BASE = {"batching.token_budget": 8192, "batching.policy.outstanding_depth": 256}
COMMON = [
    # The study sweeps a window of D samples, 8 steps a round, fixed shards (its measured
    # settings).
    "batching.policy.window_budgets=null",
    "batching.policy.max_steps_per_round=8",
    "batching.policy.shard_dealing=fixed",
    "model=cpu_bench",
    "logger=csv",
    "data.source.regime=first_exchange",
    "data.sizes.max_seq_len=2048",
    "data.sizes.val_samples=0",
]
SIM_BUDGET = 16384
SIM_WORLDS = (8, 64)
SIM_SHARD = 2185  # 17,483 ShareGPT conversations over 8 ranks
SIM_SHARD_SIZES = (273, 546, 1092, 2185, 4370)
FLAT_GAIN = 0.02  # a doubling of D that saves less than 2 % of the steps: returns flatten
SUMMARY_KEYS = (
    "emitted_samples_per_s",
    "real_tokens_per_s",
    "padding_efficiency",
    "budget_fill",
    "steps_per_rank",
    "loader_wait_share",
    "emitted_samples",
    "real_tokens",
    "padded_tokens",
    "loss_tokens",
    "alignment_rounds",
    "wall_s",
)


def sweep_points(name: str) -> tuple[str, list[int]]:
    """The key and the values of ``conf/sweep/<name>.yaml``."""
    params = OmegaConf.load(ROOT / "conf" / "sweep" / f"{name}.yaml").hydra.sweeper.params
    (key, values), *rest = params.items()
    if rest:
        raise ValueError(f"sweep {name} sweeps more than one key: {list(params)}")
    return key, [int(v) for v in str(values).split(",")]


class PeakMemory:
    """Peak summed RSS and PSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.rss = self.pss = 0
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for process in tree:
                try:
                    info = process.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss, pss = rss + info.rss, pss + info.pss
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            self.processes = max(self.processes, len(tree))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(5)
        mib = 2**20
        return {"peak_rss_mib": self.rss / mib, "peak_pss_mib": self.pss / mib}


def children_cpu_s() -> float:
    """User + system CPU seconds of every finished descendant (each process tree's
    workers are waited for by their parent, so their time is in here too)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_point(overrides: list[str], out_dir: Path, lock: Path | None) -> dict[str, Any]:
    """One ``train.py`` run: its summary figures and the peak memory of its processes."""
    command = train_command(out_dir, overrides)
    with bench_lock(lock):
        started, load = time.perf_counter(), os.getloadavg()[0]
        cpu_before = children_cpu_s()
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        memory = PeakMemory(process.pid)
        _, stderr = process.communicate()
        peaks = memory.stop()
        elapsed, cpu_s = time.perf_counter() - started, children_cpu_s() - cpu_before
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)} failed:\n{stderr[-4000:]}")
    summary = read_summary(out_dir)
    machine = {"process_s": elapsed, "cpu_s": cpu_s, "load_average_1m_at_start": load}
    return {k: summary.get(k) for k in SUMMARY_KEYS} | peaks | machine


def rotated(values: list[Any], shift: int) -> list[Any]:
    shift %= len(values)
    return values[shift:] + values[:shift]


def train_ablation(args: argparse.Namespace) -> dict[str, Any]:
    """Every point of both sweeps, interleaved, ``args.repeats`` times."""
    sweeps = {name: sweep_points(name) for name in SWEEPS}
    common = [*COMMON, f"data.sizes.max_samples={args.samples}"]
    runs: dict[str, dict[int, list[dict]]] = {name: {} for name in SWEEPS}
    for repeat in range(args.repeats):
        for name, (key, values) in sweeps.items():
            for value in rotated(values, repeat):
                base = [f"{k}={v}" for k, v in BASE.items() if k != key]
                overrides = [*common, *base, f"{key}={value}"]
                figures = run_point(overrides, args.out / f"{name}_{value}_{repeat}", args.lock)
                runs[name].setdefault(value, []).append(figures)
                print(
                    f"repeat {repeat} {key}={value}: {figures['emitted_samples_per_s']:.2f} "
                    f"samples/s, {figures['steps_per_rank']} steps, "
                    f"pss {figures['peak_pss_mib']:.0f} MiB ({figures['process_s']:.0f} s, "
                    f"load {figures['load_average_1m_at_start']:.1f})",
                    flush=True,
                )
    return {
        name: summarize_sweep(key, runs[name], BASE[key], flops_per_token_of(runs[name]))
        for name, (key, _) in sweeps.items()
    }


def flops_per_token_of(runs: dict[int, list[dict]]) -> dict[str, float]:
    """FLOPs per token of the cpu_bench model (body with attention, head)."""
    from odb_lightning.lit.model.flops import flops_per_token

    first = next(iter(runs.values()))[0]
    return flops_per_token(
        cpu_bench_config(), context_tokens=first["real_tokens"] / first["emitted_samples"] / 2
    )


def summarize_sweep(
    key: str, runs: dict[int, list[dict]], base: int, flops: dict[str, float]
) -> dict[str, Any]:
    """Medians per point, per-repeat throughput ratios to ``base`` and the cost model's.

    The cost model (as in ``experiments/odb_vs_standard``): time per epoch ~ body FLOPs x
    padded tokens + head FLOPs x supervised tokens; the samples are the same at every point.
    """

    def cost(figures: dict) -> float:
        return flops["body"] * figures["padded_tokens"] + flops["head"] * figures["loss_tokens"]

    points = []
    for value in sorted(runs):
        mine = runs[value]
        ratios = [
            run["emitted_samples_per_s"] / ref["emitted_samples_per_s"]
            for run, ref in zip(mine, runs[base], strict=True)
        ]
        median = {
            k: statistics.median(r[k] for r in mine)
            for k in (*SUMMARY_KEYS, "peak_rss_mib", "peak_pss_mib", "cpu_s")
            if mine[0].get(k) is not None
        }
        points.append(
            {
                key: value,
                "median": median,
                "runs": mine,
                "throughput_vs_base": statistics.median(ratios),
                # CPU seconds of the whole run (start-up included) barely move with load.
                "cpu_s_base_over_point": statistics.median(
                    ref["cpu_s"] / run["cpu_s"] for run, ref in zip(mine, runs[base], strict=True)
                ),
                "pair_ratios_vs_base": ratios,
                "predicted_vs_base": cost(runs[base][0]) / cost(mine[0]),
            }
        )
    return {"key": key, "base": base, "flops_per_token": flops, "points": points}


def simulate_depths(args: argparse.Namespace) -> dict[str, Any]:
    """D ablation at 8 and 64 ranks on real lengths, and the D = 512 gap by shard size."""
    real = sharegpt_lengths()
    _, depths = sweep_points("outstanding_depth")
    rows, by_shard = [], []
    for world in SIM_WORLDS:
        lengths, resampled = draw_lengths(real, world * SIM_SHARD, seed=world)
        oracle = oracle_steps_per_rank(lengths, world, SIM_BUDGET)
        for depth in depths:
            rows.append(
                asdict(
                    simulate_figures(
                        lengths, world, depth, SIM_BUDGET, resampled=resampled, oracle=oracle
                    )
                )
            )
            print(json.dumps(rows[-1]), flush=True)
        for shard in SIM_SHARD_SIZES:
            lengths, resampled = draw_lengths(real, world * shard, seed=world)
            by_shard.append(
                asdict(simulate_figures(lengths, world, 512, SIM_BUDGET, resampled=resampled))
            )
    return {
        "token_budget": SIM_BUDGET,
        "samples_per_rank": SIM_SHARD,
        "lengths": f"ShareGPT whole conversations <= 4096 tokens ({len(real)}), Qwen2.5 ChatML",
        "rows": rows,
        "flatten": {
            str(w): flatten_point([r for r in rows if r["world_size"] == w]) for w in SIM_WORLDS
        },
        "depth_512_by_shard_size": by_shard,
    }


def flatten_point(rows: list[dict]) -> dict[str, Any]:
    """Steps saved by each doubling of D, and the first D whose doubling saves < 2 %."""
    rows = sorted(rows, key=lambda r: r["outstanding_depth"])
    gains = {
        str(b["outstanding_depth"]): 1 - b["steps_per_rank"] / a["steps_per_rank"]
        for a, b in zip(rows, rows[1:], strict=False)
    }
    flat = next((int(d) // 2 for d, gain in gains.items() if gain < FLAT_GAIN), None)
    return {"steps_saved_by_doubling_to": gains, "flat_from_depth": flat}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512, help="records read per run")
    parser.add_argument("--parts", default="train,simulator")
    parser.add_argument("--lock", type=Path, help="flock this file around each timed run")
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    path = HERE / "results.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    parts.discard("tables")  # --parts tables: print the README tables of results.json
    if "simulator" in parts:
        report["simulator"] = simulate_depths(args)
    if "train" in parts:
        load_start = os.getloadavg()
        report["train"] = train_ablation(args)
        report["train_meta"] = results_meta(
            load_average_start_end=[load_start, os.getloadavg()],
            repeats=args.repeats,
            samples=args.samples,
            common_overrides=COMMON,
            base=BASE,
        )
    if parts:
        report.setdefault("commands", {}).update({part: command_line() for part in parts})
        path.write_text(json.dumps(report, indent=2) + "\n")
    from experiments.ablation.plots import markdown_tables, plot_simulator, plot_train

    print(markdown_tables(report))
    if "train" in report:
        plot_train(report["train"], HERE)
    if "simulator" in report:
        plot_simulator(report["simulator"], HERE)


if __name__ == "__main__":
    main()
