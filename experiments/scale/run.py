"""Scale of the alignment protocol: simulated 2..1,024 ranks, real Gloo at 2 and 4 processes.

Every rank gets ``--per-rank`` real ShareGPT lengths (``shards.py``: whole conversations
of at most 4,096 tokens; a seeded bootstrap of them where ``W x per-rank`` exceeds the
17,483 there are), dealt as the loader deals them; token budget 16,384.

* Simulated (``core.simulate``, the production window and alignment code): rounds, steps
  per rank against the single-rank oracle (global longest-first packing of all lengths,
  divided by W), padding efficiency, the plan's compute time per round (all W reports
  planned once, as every rank does) and the bytes one rank receives per round (the
  all-gather of W fixed-size int64 messages).
* Real: W processes on this machine, each a real gloo default group and an ``ODBLoader``
  (one worker, its collate process and the dedicated Gloo metadata channel), over a
  dataset that builds each sample from its length (no tokenization), started by the
  multi-rank harness the runtime tests use (``testing.harness.ranks``). Recorded: the
  round latency as the loader measures it (publishing the report to holding the plan:
  the all-gather plus waiting for the slowest rank's window), steps per rank, and whether
  every step equals the simulator's on the same shards.

    python -m experiments.scale.run [--per-rank 2185] [--depths 64,512] [--real-worlds 2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from experiments.common import results_meta
from experiments.scale.shards import (
    deal,
    draw_lengths,
    sharegpt_lengths,
    simulate_figures,
    study_config,
)
from odb_lightning.core.alignment import plan_round
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.simulate import simulate
from odb_lightning.core.types import SampleInfo
from odb_lightning.core.window import GroupingWindow
from odb_lightning.core.wire import decode_report, encode_report, message_length
from testing.harness.datasets import SyntheticChatDataset
from testing.harness.ranks import RankJob, run_ranks

HERE = Path(__file__).resolve().parent
SIMULATED_WORLDS = (2, 4, 8, 16, 64, 256, 1024)
BUDGET = 16384


def plan_seconds(world: int, settings: BatchingConfig) -> float:
    """Time of planning one round from ``world`` reports (what each rank computes)."""
    windows = []
    for rank in range(world):
        window = GroupingWindow(settings, settings.policy.outstanding_depth, rank=rank)
        for position in window.request():
            length = 200 + (rank * 37 + position * 101) % 3000
            window.add(SampleInfo(position, length, length // 2, position))
        windows.append(window)
    q = settings.policy.max_steps_per_round
    messages = [encode_report(w.make_report(), q) for w in windows]
    started = time.perf_counter()
    repeats = 20
    for _ in range(repeats):
        plan_round([decode_report(m, q) for m in messages], join=True)
    return (time.perf_counter() - started) / repeats


def bytes_received_per_round(world: int, settings: BatchingConfig) -> int:
    return world * message_length(settings.policy.max_steps_per_round) * 8


def percentiles_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "count": len(ordered),
    }


def simulated_row(real: list[int], world: int, depth: int, per_rank: int) -> dict:
    lengths, resampled = draw_lengths(real, world * per_rank, seed=world)
    settings = study_config(BUDGET, depth)
    figures = asdict(simulate_figures(lengths, world, depth, BUDGET, resampled=resampled))
    return figures | {
        "kind": "simulated",
        "plan_ms_per_round": 1000 * plan_seconds(world, settings),
        "bytes_received_per_round": bytes_received_per_round(world, settings),
    }


def real_row(real: list[int], world: int, depth: int, per_rank: int) -> dict:
    """``world`` real processes with a Gloo channel over the simulated twin's shards."""
    lengths, resampled = draw_lengths(real, world * per_rank, seed=world)
    dataset = SyntheticChatDataset(lengths)
    kwargs = {
        "token_budget": BUDGET,
        "outstanding_depth": depth,
        "window_budgets": None,
        "max_steps_per_round": 8,
        "num_workers": 1,
        "multiprocessing_context": "fork",
    }
    started = time.perf_counter()
    outcome = run_ranks(RankJob(dataset, kwargs), world, timeout_s=600.0)
    wall_s = time.perf_counter() - started
    if outcome.errors:
        raise RuntimeError(f"real run at {world} ranks failed: {outcome.errors}")
    epochs = [outcome.ok[rank][0] for rank in range(world)]
    shards = deal(list(range(len(lengths))), world)  # dataset indices, in arrival order
    expected = simulate(
        [[lengths[i] for i in shard] for shard in shards],
        study_config(BUDGET, depth),
        loss_tokens=[[dataset.num_loss_tokens(i) for i in shard] for shard in shards],
    )
    matches = all(
        [sorted(r["meta"].sample_ids) for r in epoch["steps"]]
        == [sorted(shard[p] for p in step) for step in rank_steps]
        for epoch, shard, rank_steps in zip(epochs, shards, expected, strict=True)
    )
    metas = [r["meta"] for epoch in epochs for r in epoch["steps"]]
    figures = asdict(simulate_figures(lengths, world, depth, BUDGET, resampled=resampled))
    steps = {len(epoch["steps"]) for epoch in epochs}
    if len(steps) != 1:
        raise RuntimeError(f"ranks ran different step counts: {sorted(steps)}")
    padded = sum(m.local_padded_tokens for m in metas if not m.is_idle)
    settings = study_config(BUDGET, depth)
    return {
        "kind": "real gloo",
        "world_size": world,
        "samples_per_rank": per_rank,
        "outstanding_depth": depth,
        "token_budget": BUDGET,
        "resampled": resampled,
        "rounds": epochs[0]["stats"].rounds,
        "steps_per_rank": steps.pop(),
        "oracle_steps_per_rank": figures["oracle_steps_per_rank"],
        "steps_vs_oracle": len(epochs[0]["steps"]) / figures["oracle_steps_per_rank"],
        "idle_steps": sum(m.is_idle for m in metas),
        "padding_efficiency": sum(m.local_real_tokens for m in metas) / padded,
        "steps_equal_simulator": matches,
        "round_latency": percentiles_ms(
            [t for epoch in epochs for t in epoch["stats"].round_latency_s]
        ),
        "window_fill_s_median": statistics.median(e["stats"].window_fill_s for e in epochs),
        "wall_s": wall_s,
        "bytes_received_per_round": bytes_received_per_round(world, settings),
    }


def markdown_table(rows: list[dict]) -> str:
    """The README table: simulated rows, then real ones (medians over their repeats)."""
    lines = [
        "| kind | D | ranks | rounds | steps/rank | steps / oracle | padding eff. | "
        "round latency median / p99 ms | bytes in/round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["kind"] != "simulated", r["outstanding_depth"], r["world_size"]) for r in rows}
    )
    for real, depth, world in keys:
        mine = [
            r
            for r in rows
            if (r["kind"] != "simulated") == real
            and (r["outstanding_depth"], r["world_size"]) == (depth, world)
        ]
        first = mine[0]
        if real:
            median = statistics.median(r["round_latency"]["median_ms"] for r in mine)
            p99 = statistics.median(r["round_latency"]["p99_ms"] for r in mine)
            latency = f"{median:.1f} / {p99:.0f} (all-gather + wait)"
            same = all(r["steps_equal_simulator"] for r in mine)
            kind = f"real gloo ({len(mine)} runs{', steps = simulator' if same else ''})"
        else:
            latency = f"plan {first['plan_ms_per_round']:.2f} (compute)"
            kind = "simulated" + (" (resampled)" if first["resampled"] else "")
        lines.append(
            f"| {kind} | {depth} | {world:,} | {first['rounds']} | {first['steps_per_rank']} | "
            f"{first['steps_vs_oracle']:.3f} | {first['padding_efficiency']:.3f} | {latency} | "
            f"{first['bytes_received_per_round']:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-rank", type=int, default=2185)
    parser.add_argument("--depths", default="64,512")
    parser.add_argument("--real-worlds", default="2,4")
    parser.add_argument("--real-repeats", type=int, default=3)
    parser.add_argument(
        "--from-results", action="store_true", help="re-plot and print the table of results.json"
    )
    args = parser.parse_args()
    if args.from_results:
        rows = json.loads((HERE / "results.json").read_text())["rows"]
        plot(rows)
        print(markdown_table(rows))
        return
    real = sharegpt_lengths()
    depths = [int(d) for d in args.depths.split(",")]
    rows = []
    load_start = os.getloadavg()
    for depth in depths:
        for world in SIMULATED_WORLDS:
            rows.append(simulated_row(real, world, depth, args.per_rank))
            print(json.dumps(rows[-1]), flush=True)
    for repeat in range(args.real_repeats):
        for depth in depths:
            for world in (int(w) for w in args.real_worlds.split(",")):
                row = real_row(real, world, depth, args.per_rank) | {"repeat": repeat}
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {
        "rows": rows,
        "meta": results_meta(
            token_budget=BUDGET,
            samples_per_rank=args.per_rank,
            lengths=f"ShareGPT whole conversations <= 4096 tokens ({len(real)}), Qwen2.5 ChatML",
            load_average_start_end=[load_start, os.getloadavg()],
        ),
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(rows)
    print(markdown_table(rows))


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for depth in sorted({r["outstanding_depth"] for r in rows}):
        sim = [r for r in rows if r["outstanding_depth"] == depth and r["kind"] == "simulated"]
        real = [r for r in rows if r["outstanding_depth"] == depth and r["kind"] == "real gloo"]
        worlds = [r["world_size"] for r in sim]
        label = f"D={depth}"
        axes[0].plot(worlds, [r["steps_vs_oracle"] for r in sim], marker="o", label=f"{label} sim")
        axes[0].scatter(
            [r["world_size"] for r in real], [r["steps_vs_oracle"] for r in real], marker="x",
            s=60, label=f"{label} real gloo",
        )  # fmt: skip
        axes[1].plot(worlds, [r["plan_ms_per_round"] for r in sim], marker="o", label=label)
        axes[2].scatter(
            [r["world_size"] for r in real], [r["round_latency"]["median_ms"] for r in real],
            marker="o", label=f"{label} median",
        )  # fmt: skip
        axes[2].scatter(
            [r["world_size"] for r in real], [r["round_latency"]["p99_ms"] for r in real],
            marker="^", label=f"{label} p99",
        )  # fmt: skip
    titles = (
        "steps per rank / single-rank oracle",
        "plan compute per round (ms), simulated",
        "round latency (ms), real gloo on 2 cores",
    )
    for axis, title in zip(axes, titles, strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("ranks")
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    figure.tight_layout()
    figure.savefig(HERE / "scale.png", dpi=120)


if __name__ == "__main__":
    main()
