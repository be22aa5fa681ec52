"""Time of one window cut (``core.grouping.padded_cuts``) on real and adversarial windows.

Real: windows of D ShareGPT whole-conversation lengths (Qwen2.5 ChatML, at most 4,096
tokens), budget 16,384. Adversarial: the patterns that make many cuts tie or sit on a
``budget / k`` boundary (equal lengths, two-length mixes, lengths near ``budget / (D/2)``),
at budgets 16,384 and 65,536; the slowest of them is reported. Also one whole epoch as
the ``oracle`` mode cuts it. Best of ``--repeats`` per window. Run from the repository root:

    .venv/bin/python -m experiments.grouping.run

Writes ``results.json`` next to this script.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from experiments.common import results_meta
from experiments.scale.shards import sharegpt_lengths
from odb_lightning.core.budget import Budget
from odb_lightning.core.grouping import padded_cuts, sort_longest_first
from odb_lightning.core.types import SampleInfo

HERE = Path(__file__).resolve().parent


def cut_ms(lengths: list[int], budget: Budget, repeats: int) -> float:
    ordered = sort_longest_first(SampleInfo(i, n, position=i) for i, n in enumerate(lengths))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        padded_cuts(ordered, budget)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def adversarial(depth: int, token_budget: int, rng: random.Random) -> list[tuple[str, list]]:
    windows = [(f"equal {n}", [n] * depth) for n in range(1, 4097, 61)]
    for k in (2, 3, depth // 8, depth // 4, depth // 3, depth // 2):
        edge = max(1, token_budget // k)
        for mix in ([edge, edge + 1], [max(1, edge - 1), edge], [edge, max(1, edge // 2)]):
            windows.append((f"mix {mix}", [rng.choice(mix) for _ in range(depth)]))
    windows.append(("mix [12, 6]", [rng.choice([12, 6]) for _ in range(depth)]))
    near = token_budget / (depth / 2)
    spread = [max(1, int(near * (1 + 0.5 * rng.random()))) for _ in range(depth)]
    windows.append(("near budget/(D/2)", spread))
    return windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="256,1024,4096")
    parser.add_argument("--windows", type=int, default=50, help="real windows per depth")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    real = sharegpt_lengths()
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        sharegpt = [cut_ms(rng.sample(real, depth), Budget(16384), args.repeats)
                    for _ in range(args.windows)]  # fmt: skip
        worst_ms, worst_name = 0.0, ""
        for token_budget in (16384, 65536):
            for name, lengths in adversarial(depth, token_budget, rng):
                ms = cut_ms(lengths, Budget(token_budget), args.repeats)
                if ms > worst_ms:
                    worst_ms, worst_name = ms, f"{name}, budget {token_budget}"
        rows.append({
            "depth": depth,
            "sharegpt_median_ms": sorted(sharegpt)[len(sharegpt) // 2],
            "sharegpt_max_ms": max(sharegpt),
            "adversarial_worst_ms": worst_ms,
            "adversarial_worst": worst_name,
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    # The oracle cuts a whole epoch as one window.
    epochs = {
        "sharegpt, every record": cut_ms(real, Budget(16384), args.repeats),
        "20,000 equal lengths of 6, budget 65,536": cut_ms([6] * 20_000, Budget(65536), 1),
    }
    print(json.dumps(epochs), flush=True)
    report = {
        "rows": rows,
        "whole_epoch_ms": epochs,
        "meta": results_meta(),
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
