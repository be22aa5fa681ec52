"""Steps of every record of each ShareGPT regime at this study's window (``outstanding_depth
= 256``), simulated at one rank: the defaults, the ramp off, and smaller step caps.

    .venv/bin/python -m experiments.throughput.window_cap

``core.simulate.simulate_dealt_epoch`` on the regime's lengths (at most 4,096 tokens) in the
loader's seeded epoch order, budget 16,384; prints steps and padding efficiency per variant.
The loader forms exactly these steps (the runtime-equals-simulator tests).
"""

from __future__ import annotations

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.data.lengths import source_lengths

VARIANTS = {
    "default": {},
    "ramp off": {"ramp_budgets": None},
    "max_steps_per_round=32": {"max_steps_per_round": 32},
    "max_steps_per_round=8": {"max_steps_per_round": 8},
    "max_steps_per_round=8, ramp off": {"max_steps_per_round": 8, "ramp_budgets": None},
}


def main() -> None:
    print("| regime | variant | steps | padding eff. |")
    print("|---|---|---|---|")
    for regime in ("whole", "first_exchange", "mix"):
        lengths = list(source_lengths("sharegpt", max_seq_len=4096, regime=regime))
        ordered = [lengths[i] for i in epoch_permutation(len(lengths), 0, 0)]
        for name, knobs in VARIANTS.items():
            config = BatchingConfig.of(token_budget=16384, outstanding_depth=256, **knobs)
            steps = simulate_dealt_epoch(ordered, 1, config).steps[0]
            groups = [s.group for s in steps if s.group is not None]
            padded = sum(g.num_padded_tokens for g in groups)
            print(f"| {regime} | {name} | {len(steps):,} | {sum(ordered) / padded:.3f} |")


if __name__ == "__main__":
    main()
