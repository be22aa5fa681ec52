"""Scale of the alignment protocol, simulated: 8..1,024 ranks in one process.

For each world size, every rank gets a shard of ShareGPT-like lengths (lognormal, mean
1,456, CV 0.54, at most 4,096 tokens); the simulator runs the production window and
alignment code for one epoch. Recorded per world size: rounds, steps per rank, the
alignment plan's compute time per round (all ranks' reports planned once, as each rank
does), bytes one rank receives per round (the all-gather of W fixed-size int64 messages),
padding efficiency, and steps per rank against the oracle (global longest-first packing of
all lengths, divided evenly over the ranks: the best any aligned schedule can do).

    python experiments/scale/run.py [--per-rank 200] [--depths 64,512]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

from odb_lightning.core.alignment import plan_round
from odb_lightning.core.budget import Budget
from odb_lightning.core.grouping import group_lengths
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.settings import LoaderSettings
from odb_lightning.core.simulate import simulate_epoch
from odb_lightning.core.wire import decode_report, message_length

HERE = Path(__file__).resolve().parent
WORLD_SIZES = (8, 16, 64, 256, 1024)
BUDGET = 16384


def plan_seconds(world: int, settings: LoaderSettings) -> float:
    """Time of planning one round from ``world`` reports (what each rank computes)."""
    from odb_lightning.core.types import SampleInfo
    from odb_lightning.core.window import GroupingWindow
    from odb_lightning.core.wire import encode_report

    windows = []
    for rank in range(world):
        window = GroupingWindow(settings, settings.outstanding_depth, rank=rank)
        for position in window.request():
            length = 200 + (rank * 37 + position * 101) % 3000
            window.add(SampleInfo(position, length, length // 2, position))
        windows.append(window)
    q = settings.max_steps_per_round
    messages = [encode_report(w.make_report(q), q) for w in windows]
    started = time.perf_counter()
    repeats = 20
    for _ in range(repeats):
        plan_round([decode_report(m, q) for m in messages], join=True)
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-rank", type=int, default=200)
    parser.add_argument("--depths", default="64,512")
    args = parser.parse_args()
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        settings = LoaderSettings(token_budget=BUDGET, outstanding_depth=depth)
        for world in WORLD_SIZES:
            everything = lognormal_lengths(
                world * args.per_rank, 1456, 0.54, seed=world, max_len=4096
            )
            shards = [everything[r::world] for r in range(world)]
            started = time.perf_counter()
            result = simulate_epoch(shards, settings)
            elapsed = time.perf_counter() - started
            steps = len(result.steps[0])
            real = sum(everything)
            padded = sum(
                s.group.num_padded_tokens for rank in result.steps for s in rank if s.group
            )
            oracle_steps = len(group_lengths(everything, Budget(BUDGET))) / world
            rows.append(
                {
                    "outstanding_depth": depth,
                    "world_size": world,
                    "samples": len(everything),
                    "rounds": result.rounds,
                    "steps_per_rank": steps,
                    "oracle_steps_per_rank": oracle_steps,
                    "steps_vs_oracle": steps / oracle_steps,
                    "idle_steps": sum(1 for rank in result.steps for s in rank if s.group is None),
                    "padding_efficiency": real / padded,
                    "simulation_s": elapsed,
                    "plan_ms_per_round": 1000 * plan_seconds(world, settings),
                    "bytes_received_per_round": world
                    * message_length(settings.max_steps_per_round)
                    * 8,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    report = {
        "rows": rows,
        "meta": {
            "date": date.today().isoformat(),
            "token_budget": BUDGET,
            "lengths": "lognormal mean 1456, CV 0.54, max 4096",
            "command": "python experiments/scale/run.py",
        },
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2))
    plot(rows)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for depth in sorted({r["outstanding_depth"] for r in rows}):
        mine = [r for r in rows if r["outstanding_depth"] == depth]
        worlds = [r["world_size"] for r in mine]
        axes[0].plot(worlds, [r["steps_vs_oracle"] for r in mine], marker="o", label=f"D={depth}")
        axes[1].plot(worlds, [r["plan_ms_per_round"] for r in mine], marker="o", label=f"D={depth}")
    for axis, title in zip(
        axes, ("steps per rank / oracle", "plan compute per round (ms)"), strict=True
    ):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("ranks")
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(HERE / "scale.png", dpi=120)


if __name__ == "__main__":
    main()
