"""Utilization under the model's FLOPs (a 7B Llama shape) at 8,192 and 32,768 tokens.

The budget's cost with ``attention_weight = w`` is a row's training FLOPs in units of one
token's linear FLOPs (``core/flops.py``); for the 7B shape (32 layers, 4,096 wide, 6.6e9
matmul parameters) ``w`` is 1.98e-5. Per cell, one epoch of long-context lengths
(lognormal, mean a quarter of the budget, CV 1.0, at most the budget; 2,000 samples a
rank) is dealt by need over ``W`` ranks with the defaults, twice: grouped and levelled by
the token cost (``attention_weight`` 0) and by the FLOP cost; both epochs are
then scored under the FLOP cost (``core.sync``), the ranks' real compute. The padded
tokens' utilization of each is given too.

    python -m experiments.sync_efficiency.flop_cost [--worlds 1,8,64] [--per-rank 2000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.common import results_meta
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.flops import attention_weight_of
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.core.sync import sync_figures

HERE = Path(__file__).resolve().parent
LAYERS, WIDTH, FFN, VOCAB = 32, 4096, 11008, 32000
MATMUL = LAYERS * (4 * WIDTH**2 + 3 * WIDTH * FFN) + VOCAB * WIDTH
WEIGHT = attention_weight_of(LAYERS, WIDTH, MATMUL)


def cell(world: int, budget: int, per_rank: int) -> dict:
    drawn = lognormal_lengths(world * per_rank, budget / 4, 1.0, seed=world, max_len=budget)
    ordered = [drawn[i] for i in epoch_permutation(len(drawn), 0, 0)]
    flops = BatchingConfig.of(token_budget=budget, attention_weight=WEIGHT)
    row: dict = {"world_size": world, "token_budget": budget, "samples": len(ordered)}
    for name, weight in (("token", 0.0), ("flop", WEIGHT)):
        config = BatchingConfig.of(token_budget=budget, attention_weight=weight)
        result = simulate_dealt_epoch(ordered, world, config)
        groups = [[s.group for s in rank] for rank in result.steps]
        row[f"{name}_steps_per_rank"] = len(result.steps[0])
        row[f"{name}_utilization_flops"] = sync_figures(groups, flops.budget).utilization
        row[f"{name}_utilization_tokens"] = sync_figures(
            groups, BatchingConfig.of(token_budget=budget).budget
        ).utilization
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| budget | ranks | grouped by | steps / rank | utilization (FLOPs) "
        "| utilization (padded tokens) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for name in ("token", "flop"):
            lines.append(
                f"| {r['token_budget']:,} | {r['world_size']} | {name} cost | "
                f"{r[f'{name}_steps_per_rank']} | {r[f'{name}_utilization_flops']:.3f} | "
                f"{r[f'{name}_utilization_tokens']:.3f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="1,8,64")
    parser.add_argument("--per-rank", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for budget in (8192, 32768):
            rows.append(cell(world, budget, args.per_rank))
            print(markdown(rows[-1:]), flush=True)
    out = {"meta": results_meta(), "attention_weight": WEIGHT, "rows": rows}
    (HERE / "flop_cost_results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
