"""Sync efficiency and utilization of simulated epochs at 8 and 64 ranks.

A step takes as long as its slowest rank, so every epoch is scored by the budget's cost
model (``core.sync``): per-step sync efficiency (mean over ranks of the step's cost / its
max), utilization (useful cost / (W x sum of per-step max cost)), steps against the
single-rank oracle, and IDLE steps. Default batching settings except the token budget.

* Sets: real lengths after the Qwen2.5 ChatML template, at most 4,096 tokens (ShareGPT
  whole conversations, ShareGPT first exchange, Chit-Chat), and the synthetic lognormal
  profiles (``data.synthetic.LENGTH_PROFILES`` plus one with Chit-Chat's mean and CV).
  At 8 ranks the whole set is dealt as the loader deals it (one seeded shuffle, every
  W-th index); at 64 ranks each rank gets as many samples as at 8, a seeded bootstrap.
* Oracle: global longest-first packing of all lengths under the budget, divided by W.
* Per-rank floor: the sorted lengths dealt round robin (rank ``r`` takes every W-th from
  the ``r``-th longest; it needs every length up front), each rank's share grouped as a
  window groups it; the most groups of a rank over the oracle. No schedule in which each
  rank groups its own samples does much better.
* ``--tail``: 16,000 lengths under an 8,192-token budget with a 5 % tail at 16,384
  (``tail_lengths``): samples over the budget run alone.
* ``--reference``: the same shards grouped by the reference package's
  ``odb.grouping.grouping_data`` (its real code, ``online-dynamic-batching``), one
  thread per rank, its all-gather served in memory (see ``reference.py``).

    python -m experiments.sync_efficiency.run [--label current] [--worlds 8,64] [--synthetic]
        [--tail] [--reference] [--sets a,b] [--knobs field=value,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

from experiments.common import results_meta
from experiments.scale.shards import draw_lengths
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import group_lengths
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch, simulate_epoch

HERE = Path(__file__).resolve().parent
MAX_SEQ_LEN = 4096
BYTES_PER_TOKEN = 16.2
CASES = (  # (set, token budget)
    ("sharegpt_whole", 16384),
    ("sharegpt_first_exchange", 16384),
    ("chitchat", 16384),
    ("sharegpt_whole", 49152),
)
REAL_SETS = {
    "sharegpt_whole": ("sharegpt", "whole"),
    "sharegpt_first_exchange": ("sharegpt", "first_exchange"),
    "chitchat": ("chitchat", "whole"),
}


def real_lengths() -> dict[str, list[int]]:
    from odb_lightning.data.lengths import source_lengths

    return {
        name: list(source_lengths(source, max_seq_len=MAX_SEQ_LEN, regime=regime))
        for name, (source, regime) in REAL_SETS.items()
    }


def synthetic_lengths(real: dict[str, list[int]]) -> dict[str, list[int]]:
    """The lognormal profiles, each as many samples as ShareGPT whole."""
    from odb_lightning.data.synthetic import LENGTH_PROFILES, LengthProfile

    n = len(real["sharegpt_whole"])
    chat = real["chitchat"]
    profiles = {
        name: (p.mean_length, p.cv)
        for name, p in LENGTH_PROFILES.items()
        if isinstance(p, LengthProfile)
    }
    profiles["chitchat"] = (
        statistics.fmean(chat),
        statistics.pstdev(chat) / statistics.fmean(chat),
    )
    return {
        f"synthetic_{name}": lognormal_lengths(n, mean, cv, seed=0, max_len=MAX_SEQ_LEN)
        for name, (mean, cv) in profiles.items()
    }


TAIL_BUDGET = 8192


def tail_lengths(count: int = 16000) -> list[int]:
    """Lengths under an 8,192-token budget with a 5 % tail at 16,384 tokens (each such
    sample runs alone, and their count differs from rank to rank and round to round)."""
    from odb_lightning.core.order import make_rng

    rng = make_rng(0, "tail")
    base = lognormal_lengths(count, 1500, 0.9, seed=0, max_len=TAIL_BUDGET)
    return [2 * TAIL_BUDGET if rng.random() < 0.05 else length for length in base]


def epoch_lengths(lengths: list[int], world: int) -> list[int]:
    """The epoch's lengths in the loader's seeded order (``core.order.epoch_permutation``):
    8 ranks the whole set; more a bootstrap with the same samples per rank."""
    count = len(lengths) if world <= 8 else world * (len(lengths) // 8)
    drawn, _ = draw_lengths(lengths, count, seed=world)
    return [drawn[i] for i in epoch_permutation(len(drawn), 0, 0)]


def shards_of(ordered: list[int], world: int) -> list[list[int]]:
    """Fixed shards as the loader deals them: every ``world``-th of the epoch order."""
    return [ordered[rank::world] for rank in range(world)]


def per_rank_floor(lengths: list[int], world: int, config: BatchingConfig) -> int:
    """Most groups of a rank when the sorted lengths are dealt round robin."""
    ordered = sorted(lengths, reverse=True)
    return max(len(group_lengths(ordered[rank::world], config.budget)) for rank in range(world))


def measure(ordered: list[int], world: int, config: BatchingConfig) -> dict:
    everything = ordered
    started, cpu_started = time.perf_counter(), time.process_time()
    if config.policy.by_need:
        # Moved bytes at the measured 16.2 serialized bytes per ShareGPT token (README).
        moving = config.policy.groups_across_ranks
        sizes = [round(BYTES_PER_TOKEN * n) for n in ordered] if moving else None
        result = simulate_dealt_epoch(ordered, world, config, sample_bytes=sizes)
    else:
        result = simulate_epoch(shards_of(ordered, world), config)
    elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    oracle = len(plan_epoch(everything, mode="oracle", token_budget=config.token_budget)) / world
    steps = len(result.steps[0])
    groups = [s.group for rank in result.steps for s in rank if s.group is not None]
    sync = asdict(result.sync)
    return {
        "world_size": world,
        "samples": len(everything),
        "token_budget": config.token_budget,
        "rounds": result.rounds,
        "steps_per_rank": steps,
        "oracle_steps_per_rank": oracle,
        "steps_vs_oracle": steps / oracle,
        "per_rank_floor_vs_oracle": per_rank_floor(everything, world, config) / oracle,
        "utilization": sync["utilization"],
        "sync_efficiency": sync["sync_efficiency"],
        "idle_fraction": sync["idle_fraction"],
        "padding_efficiency": sum(everything) / sum(g.num_padded_tokens for g in groups),
        "grouped_per_step": sum(result.grouped) / (world * steps),
        "groupings_per_sample": sum(result.grouped) / len(everything),
        "simulation_s": elapsed,
        "simulation_ms_per_step": 1e3 * elapsed / max(1, steps),
        "planning_cpu_s": cpu_s,
        "moved_samples": sum(result.moved_samples),
        "moved_bytes": sum(result.moved_bytes),
        "moved_bytes_per_rank_step": sum(result.moved_bytes) / (world * max(1, steps)),
        "pooled_rounds": len(result.pool_plan_s),
        "pool_plan_ms_max": 1e3 * max(result.pool_plan_s, default=0.0),
    }


def _value(text: str) -> int | float | str | bool | None:
    if text == "null":
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def markdown(rows: list[dict]) -> str:
    lines = [
        "| set | budget | ranks | grouping | utilization | sync eff. | steps / oracle | "
        "per-rank floor / oracle | IDLE | pad. eff. | groupings / sample | ms / step | "
        "moved KiB / rank-step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        grouped = r.get("groupings_per_sample")
        floor = r.get("per_rank_floor_vs_oracle")
        lines.append(
            f"| {r['set']} | {r['token_budget']:,} | {r['world_size']} | {r['grouping']} | "
            f"{r['utilization']:.3f} | {r['sync_efficiency']:.3f} | {r['steps_vs_oracle']:.3f} | "
            f"{'-' if floor is None else f'{floor:.3f}'} | "
            f"{100 * r['idle_fraction']:.1f} % | {r['padding_efficiency']:.3f} | "
            f"{'-' if grouped is None else f'{grouped:.2f}'} | "
            f"{r['simulation_ms_per_step']:.2f} | "
            f"{r.get('moved_bytes_per_rank_step', 0) / 1024:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="current", help="key of this run in results.json")
    parser.add_argument("--worlds", default="8,64")
    parser.add_argument("--synthetic", action="store_true", help="add the synthetic profiles")
    parser.add_argument(
        "--tail", action="store_true", help="add 16,000 lengths with a 5 %% tail over 8,192"
    )
    parser.add_argument("--reference", action="store_true", help="add the reference package")
    parser.add_argument(
        "--reference-buffer", type=int, default=256, help="its buffer_size (window and slots)"
    )
    parser.add_argument("--sets", default="", help="only these sets (comma-separated)")
    parser.add_argument(
        "--lengths", default="", help="the real sets' lengths from a JSON file (set: lengths)"
    )
    parser.add_argument(
        "--union-only",
        action="store_true",
        help="pooled rounds always group the union (no plan that keeps samples local)",
    )
    parser.add_argument(
        "--knobs", default="", help="batching fields to change, e.g. window_budgets=32"
    )
    args = parser.parse_args()
    knobs = {k: _value(v) for k, v in (kv.split("=") for kv in args.knobs.split(",") if kv)}
    if args.union_only:
        import odb_lightning.core.pool_plan as pool_plan

        pool_plan.LEVEL_TOLERANCE = -1.0  # the local plan is never within it
    lengths = json.loads(Path(args.lengths).read_text()) if args.lengths else real_lengths()
    cases = list(CASES)
    if args.synthetic:
        synthetic = synthetic_lengths(lengths)
        lengths |= synthetic
        cases += [(name, budget) for name in synthetic for budget in (16384, 49152)]
    if args.tail:
        lengths["synthetic_tail"] = tail_lengths()
        cases.append(("synthetic_tail", TAIL_BUDGET))
    if args.sets:
        wanted = set(args.sets.split(","))
        cases = [c for c in cases if c[0] in wanted]
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for name, budget in cases:
            ordered = epoch_lengths(lengths[name], world)
            config = replace(BatchingConfig.of(**knobs), token_budget=budget)
            rows.append({"set": name, "grouping": args.label} | measure(ordered, world, config))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
            if args.reference:
                from experiments.sync_efficiency.reference import measure_reference

                row = measure_reference(shards_of(ordered, world), budget, args.reference_buffer)
                rows.append({"set": name, "grouping": "reference"} | row)
                print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    stored["runs"][args.label] = {"meta": results_meta(), "rows": rows}
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
