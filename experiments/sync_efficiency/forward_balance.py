"""Measured forward time per rank under the token cost and the FLOP cost (2 ranks, CPU).

One epoch of samples (lognormal lengths, clipped to the preset's range; ``--samples``) is
dealt by need over 2 ranks and grouped by the simulator twice: under the token cost
(``attention_weight`` 0) and under the FLOP cost of the preset's body
(``attention_weight_of`` its shape, what a run resolves by default). Every step's two
groups then run through that small Qwen2 decoder, each group as its padded batch of
random ids, forward only, sdpa, one intra-op thread per rank. Per step the slowest
rank's forward time over the mean of the two; the figure is the mean over steps (1.0:
level).

Presets:

* ``long`` (the default): 4,096-16,384 tokens (mean 8,000, CV 0.5) under a 32,768-token
  budget; the body is 1 layer of 128 (2 heads of 64), MLP 3,840, a 2,048-token head
  (``w`` 7.1e-5: attention is 29 % of the linear work at 4,096 tokens, 116 % at 16,384).
* ``short``: 1,024-6,144 tokens (mean 1,500, CV 0.8) under 16,384; 4 layers of 256, MLP
  512, a 4,096-token head (``w L`` is 1.1 at 4,096).

Timing:

* concurrent (the default): the two ranks are two processes running at the same time,
  each pinned to its own core with one thread, joined by a Gloo group. Both cost models'
  steps are interleaved (step ``t`` by tokens, then step ``t`` by FLOPs, ...); before
  every timed forward the ranks meet at a barrier, then each times its own batch. A
  step's wall time is from the first rank's start to the last rank's end (one monotonic
  clock). Each step runs ``--repeats`` times; the medians are kept.
* ``--sequential``: one process times each step's two batches one after the other (the
  median of ``--repeats`` timings of each batch).

Every forward is timed twice: wall time, and the rank process's CPU time. On a machine
shared with other jobs the CPU time is the rank's own work (a rank that waits for its
core, niced behind other processes, shows the wait in wall time only), so the figures
are given for both clocks.

    python -m experiments.sync_efficiency.forward_balance [--preset long] [--samples 96]
        [--repeats 3] [--sequential] [--lock /tmp/odb_bench.lock]

Each run is stored under ``<preset>_<concurrent|sequential>`` in
``forward_balance_results.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from experiments.common import bench_lock, results_meta
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.flops import attention_weight_of, decoder_matmul_parameters
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch

HERE = Path(__file__).resolve().parent
PRESETS = {
    "long": {
        "lengths": {"mean": 8000, "cv": 0.5, "shortest": 4096, "longest": 16384},
        "budget": 32768,
        "shape": {"hidden_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2}
        | {"num_key_value_heads": 2, "intermediate_size": 3840, "vocab_size": 2048},
    },
    "short": {
        "lengths": {"mean": 1500, "cv": 0.8, "shortest": 1024, "longest": 6144},
        "budget": 16384,
        "shape": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4}
        | {"num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 4096},
    },
}
BARRIER_TIMEOUT = datetime.timedelta(minutes=10)


def weight_of(shape: dict) -> float:
    """The FLOP cost's ``attention_weight`` of a body (``core/flops.py``)."""
    width, layers = shape["hidden_size"], shape["num_hidden_layers"]
    heads = shape["num_attention_heads"]
    matmul = decoder_matmul_parameters(
        hidden_size=width,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=shape["num_key_value_heads"],
        head_dim=width // heads,
        intermediate_size=shape["intermediate_size"],
        vocab_size=shape["vocab_size"],
    )
    return attention_weight_of(layers, width, matmul)


def build_model(shape: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", tie_word_embeddings=True, **shape)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def forward_s(model: torch.nn.Module, vocab: int, rows: int, length: int) -> list[float]:
    """One forward of a ``rows x length`` batch of random ids: its start and end on the
    monotonic clock and the CPU time it took (an IDLE step, ``rows`` 0, takes none)."""
    ids = torch.randint(0, vocab, (max(rows, 1), max(length, 1)))
    with torch.inference_mode():
        started, cpu = time.perf_counter(), time.process_time()
        if rows:
            model(input_ids=ids)
        return [started, time.perf_counter(), time.process_time() - cpu]


def plan(lengths: list[int], budget: int, weight: float) -> list[list[tuple[int, int]]]:
    """Per step, each rank's batch as ``(rows, padded length)`` (``(0, 0)``: IDLE)."""
    config = BatchingConfig.of(token_budget=budget, attention_weight=weight)
    result = simulate_dealt_epoch(lengths, 2, config)
    return [
        [(0, 0) if s.group is None else (s.group.size, s.group.longest) for s in column]
        for column in zip(*result.steps, strict=True)
    ]


def figures(steps: list[list[float]], walls: list[float] | None) -> dict:
    """Per-step forward times of the two ranks -> the imbalance figures."""
    ratios = [max(step) / statistics.fmean(step) for step in steps if max(step) > 0]
    row = {
        "steps_per_rank": len(steps),
        "slowest_over_mean": statistics.fmean(ratios),
        "slowest_over_mean_median": statistics.median(ratios),
        "paced_forward_s": sum(max(step) for step in steps),  # each step waits for its slowest
        "rank_forward_s": [sum(step[r] for step in steps) for r in range(2)],
        "step_forward_s": steps,
    }
    if walls is not None:
        row["step_wall_s"] = sum(walls)
        row["step_walls_s"] = walls
    return row


def sequential(plans: dict, shape: dict, repeats: int) -> dict:
    model = build_model(shape)
    out = {}
    for name, steps in plans.items():
        runs = [
            [
                [forward_s(model, shape["vocab_size"], *batch) for _ in range(repeats)]
                for batch in column
            ]
            for column in steps
        ]
        out[name] = {
            "wall": figures(
                [[statistics.median(e - s for s, e, _ in b) for b in c] for c in runs], None
            ),
            "cpu": figures([[statistics.median(u for *_, u in b) for b in c] for c in runs], None),
        }
    return out


def interleaved(plans: dict) -> list[tuple[str, int]]:
    """``(cost model, step)`` in the order the concurrent ranks run them."""
    longest = max(len(steps) for steps in plans.values())
    return [(name, t) for t in range(longest) for name in plans if t < len(plans[name])]


def _rank(rank: int, plans: dict, shape: dict, repeats: int, store_dir: str) -> None:
    import torch.distributed as dist

    from odb_lightning.runtime.lifecycle import prepare_child

    prepare_child()  # one thread; exits when the main process dies
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})  # one core a rank
    store = dist.FileStore(os.path.join(store_dir, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=BARRIER_TIMEOUT)
    model = build_model(shape)
    forward_s(model, shape["vocab_size"], 1, 512)  # first-call setup, untimed
    spans = []
    for name, t in interleaved(plans):
        rows, length = plans[name][t][rank]
        runs = []
        for _ in range(repeats):
            dist.barrier()  # both ranks start the step together, as in a DDP step
            runs.append(forward_s(model, shape["vocab_size"], rows, length))
        spans.append(runs)
    dist.barrier()
    dist.destroy_process_group()
    Path(store_dir, f"rank{rank}.json").write_text(json.dumps(spans))


def concurrent(plans: dict, shape: dict, repeats: int) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as store_dir:
        # spawn joins both ranks and ends the other when one fails
        mp.spawn(_rank, args=(plans, shape, repeats, store_dir), nprocs=2, join=True)
        spans = [json.loads(Path(store_dir, f"rank{r}.json").read_text()) for r in range(2)]
    wall = {name: [] for name in plans}
    cpu = {name: [] for name in plans}
    step_walls = {name: [] for name in plans}
    for k, (name, _) in enumerate(interleaved(plans)):
        runs = list(zip(spans[0][k], spans[1][k], strict=True))  # per repeat, both ranks
        wall[name].append([statistics.median(r[i][1] - r[i][0] for r in runs) for i in range(2)])
        cpu[name].append([statistics.median(r[i][2] for r in runs) for i in range(2)])
        step_walls[name].append(
            statistics.median(max(a[1], b[1]) - min(a[0], b[0]) for a, b in runs)
        )
    return {
        name: {"wall": figures(wall[name], step_walls[name]), "cpu": figures(cpu[name], None)}
        for name in plans
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="long")
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sequential", action="store_true", help="time the ranks in turn")
    parser.add_argument(
        "--lock", type=Path, help="hold this flock while timing (common.bench_lock)"
    )
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    spread = preset["lengths"]
    drawn = lognormal_lengths(
        args.samples, spread["mean"], spread["cv"], seed=0, max_len=spread["longest"]
    )
    lengths = [max(spread["shortest"], n) for n in drawn]
    weight = weight_of(preset["shape"])
    plans = {"token": plan(lengths, preset["budget"], 0.0)}
    plans["flop"] = plan(lengths, preset["budget"], weight)
    with bench_lock(args.lock):
        load = os.getloadavg()
        started = time.perf_counter()
        if args.sequential:
            torch.set_num_threads(1)
            rows = sequential(plans, preset["shape"], args.repeats)
        else:
            rows = concurrent(plans, preset["shape"], args.repeats)
        elapsed, load_after = time.perf_counter() - started, os.getloadavg()
    timing = "sequential" if args.sequential else "concurrent"
    for name, both in rows.items():
        for clock, row in both.items():
            wall = f", step walls {row['step_wall_s']:.1f} s" if "step_wall_s" in row else ""
            print(
                f"{name} cost ({clock}): {row['steps_per_rank']} steps, slowest rank's forward "
                f"over the mean {row['slowest_over_mean']:.3f} (median "
                f"{row['slowest_over_mean_median']:.3f}), paced by the slower rank "
                f"{row['paced_forward_s']:.1f} s{wall}",
                flush=True,
            )
    path = HERE / "forward_balance_results.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    runs = stored.get("runs", {})
    runs[f"{args.preset}_{timing}"] = {
        "meta": results_meta(load_before=load, load_after=load_after, elapsed_s=elapsed),
        "preset": preset,
        "samples": args.samples,
        "lengths": lengths,
        "weight": weight,
        "rows": rows,
    }
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
