"""The window ramp, simulated at 1, 8 and 64 ranks: what the first step waits for, and the
grouping with the ramp off and on.

The sets, the dealing and the oracle are those of ``experiments/sync_efficiency`` (real
lengths after the Qwen2.5 ChatML template, at most 4,096 tokens; at 64 ranks a seeded
bootstrap with as many samples per rank as at 8; oracle: global longest-first packing
divided by ``W``). Default batching settings except the token budget, and
``ramp_budgets`` off (``null``) or on (the default, 2). Per row:

* first step: the samples (and their work, in budgets) that had arrived at the window
  of the rank that waited for the most when the first round emitted
  (``SimulationResult.first_step_samples`` / ``first_step_cost``);
* steps against the oracle, utilization, padding efficiency of the whole epoch, and with
  the ramp the padding efficiency of the steps after its rounds (the first
  ``len(core.ramp.ramp_targets(policy))`` emitting rounds; ``-`` where the epoch has no
  round after them).
* ``--growth G``: the ramp's growth per emitting round (``core.ramp.RAMP_GROWTH``, 4).
* ``--large N``: also an epoch of ``N`` lengths drawn with replacement from ShareGPT whole
  (seeded), in one seeded order, at ``--large-worlds`` ranks (a user's scale: the ramp's
  cost is a few steps per rank, whatever the epoch's length).

    python -m experiments.ramp.run [--worlds 1,8,64] [--large 902087] [--knobs shard_dealing=fixed]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from experiments.common import results_meta
from experiments.scale.shards import draw_lengths
from experiments.sync_efficiency.run import (
    CASES,
    epoch_lengths,
    real_lengths,
    shards_of,
    synthetic_lengths,
)
from odb_lightning.core import ramp as ramp_module
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.ramp import ramp_targets
from odb_lightning.core.simulate import SimulationResult, simulate_dealt_epoch, simulate_epoch

HERE = Path(__file__).resolve().parent
RAMPS = {"off": None, "on": 2}
LARGE_SET = "sharegpt_whole"
LARGE = (16384, 49152)  # token budgets of the large epoch


def padding_efficiency(result: SimulationResult, skip_rounds: int) -> float:
    """Real over padded tokens of every rank's steps after the first ``skip_rounds``
    emitting rounds."""
    emitting = sorted({s.round_index for s in result.steps[0]})
    after = set(emitting[skip_rounds:])
    groups = [
        s.group
        for rank in result.steps
        for s in rank
        if s.group is not None and s.round_index in after
    ]
    real = sum(m.length for g in groups for m in g.samples)
    padded = sum(g.num_padded_tokens for g in groups)
    return real / padded if padded else math.nan


def measure(ordered: list[int], world: int, config: BatchingConfig, skip_rounds: int) -> dict:
    if config.policy.by_need:
        result = simulate_dealt_epoch(ordered, world, config)
    else:
        result = simulate_epoch(shards_of(ordered, world), config)
    oracle = len(plan_epoch(ordered, mode="oracle", token_budget=config.token_budget)) / world
    steps = len(result.steps[0])
    waited = max(range(world), key=lambda r: result.first_step_samples[r])
    return {
        "world_size": world,
        "samples": len(ordered),
        "token_budget": config.token_budget,
        "ramp_budgets": config.policy.ramp_budgets,
        "first_step_samples": result.first_step_samples[waited],
        "first_step_budgets": result.first_step_cost[waited] / config.token_budget,
        "first_step_samples_mean": sum(result.first_step_samples) / world,
        "rounds": result.rounds,
        "steps_per_rank": steps,
        "steps_vs_oracle": steps / oracle,
        "utilization": result.sync.utilization,
        "padding_efficiency": padding_efficiency(result, 0),
        "skipped_rounds": skip_rounds,
        "padding_efficiency_after_ramp": padding_efficiency(result, skip_rounds),
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| set | budget | ranks | ramp | first step: samples (budgets) | steps / oracle | "
        "utilization | pad. eff. | pad. eff. after the ramp's rounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ramp = "off" if r["ramp_budgets"] is None else f"{r['ramp_budgets']}"
        lines.append(
            f"| {r['set']} | {r['token_budget']:,} | {r['world_size']} | {ramp} | "
            f"{r['first_step_samples']:,} ({r['first_step_budgets']:.1f}) | "
            f"{r['steps_vs_oracle']:.3f} | {r['utilization']:.3f} | "
            f"{r['padding_efficiency']:.4f} | {_figure(r['padding_efficiency_after_ramp'])} |"
        )
    return "\n".join(lines)


def _figure(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.4f}"


def _value(text: str) -> int | str | None:
    if text == "null":
        return None
    return int(text) if text.lstrip("-").isdigit() else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="default", help="key of this run in results.json")
    parser.add_argument("--worlds", default="1,8,64")
    parser.add_argument("--synthetic", action="store_true", help="add the synthetic profiles")
    parser.add_argument("--knobs", default="", help="batching fields to change, e.g. join=0")
    parser.add_argument(
        "--large", type=int, default=0, help=f"add an epoch of this many {LARGE_SET} lengths"
    )
    parser.add_argument("--large-worlds", default="1,8", help="rank counts of the large epoch")
    parser.add_argument(
        "--growth", type=int, default=ramp_module.RAMP_GROWTH, help="the ramp's growth per round"
    )
    parser.add_argument(
        "--lengths", default="", help="the real sets' lengths from a JSON file (set: lengths)"
    )
    args = parser.parse_args()
    ramp_module.RAMP_GROWTH = args.growth  # the study of the constant itself
    knobs = {k: _value(v) for k, v in (kv.split("=") for kv in args.knobs.split(",") if kv)}
    lengths = json.loads(Path(args.lengths).read_text()) if args.lengths else real_lengths()
    cases = list(CASES)
    if args.synthetic:
        synthetic = synthetic_lengths(lengths)
        lengths |= synthetic
        cases += [(name, budget) for name in synthetic for budget in (16384, 49152)]
    runs = [
        (name, budget, world, epoch_lengths(lengths[name], world))
        for world in (int(w) for w in args.worlds.split(","))
        for name, budget in cases
    ]
    if args.large:
        drawn, _ = draw_lengths(lengths[LARGE_SET], args.large, seed=0)
        ordered = [drawn[i] for i in epoch_permutation(len(drawn), 0, 0)]
        for world in (int(w) for w in args.large_worlds.split(",")):
            runs += [(f"{LARGE_SET}_{args.large}", budget, world, ordered) for budget in LARGE]
    rows = []
    for name, budget, world, ordered in runs:
        base = replace(BatchingConfig.of(**knobs), token_budget=budget)
        ramped = BatchingConfig.of(base, ramp_budgets=RAMPS["on"])
        for ramp in RAMPS.values():
            config = BatchingConfig.of(base, ramp_budgets=ramp)
            skip = len(ramp_targets(ramped.policy)) if ramp is not None else 0
            rows.append({"set": name} | measure(ordered, world, config, skip))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    stored["runs"][args.label] = {"meta": results_meta(ramp_growth=args.growth), "rows": rows}
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
