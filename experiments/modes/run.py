"""Every batching mode in real training, side by side: one table per length regime.

For each regime (ShareGPT whole conversations, the 50/50 whole/first-exchange mix) and
each mode, runs `train.py` with the same data, token budget and CPU benchmark model
(`model=cpu_bench`: body-dominated FLOPs, real Qwen2.5 tokens and lengths), the modes
interleaved, and records padding efficiency, steps per epoch, emitted samples/s, real
tokens/s and the length-cache build time from each run's summary.json.

    python -m experiments.modes.run [--samples 112] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from experiments.common import results_meta, run_train
from odb_lightning.core.modes import MODES as REGISTERED

HERE = Path(__file__).resolve().parent
# odb_packed is left out on CPU: without varlen kernels its block-diagonal mask makes
# attention dense over the whole packed row, (sum L)^2 per step (a 16k-token row costs
# about 50x a padded step here); its padding efficiency is 1.0 by construction
# (tests/integration/test_train_packed.py). Run it with --modes on a GPU with flash-attn.
MODES = ("standard", "sorted", "bucketed", "oracle", "odb")
ONLINE = {name: mode.policy.online for name, mode in REGISTERED.items()}
REGIMES = ("whole", "mix")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=112, help="records read per regime")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    args = parser.parse_args()
    modes = args.modes.split(",")
    cache_dir = args.out / "length_cache"
    shutil.rmtree(cache_dir, ignore_errors=True)  # the first length-pass run builds it
    overrides = [
        "model=cpu_bench",
        "logger=csv",
        "data.sizes.max_seq_len=4096",
        f"data.sizes.max_samples={args.samples}",
        "data.sizes.val_samples=0",
        f"data.caches.length_dir={cache_dir}",
        f"batching.token_budget={args.token_budget}",
    ]
    runs: dict[str, dict[str, list[dict]]] = {r: {m: [] for m in modes} for r in REGIMES}
    for repeat in range(args.repeats):
        for regime in REGIMES:
            for mode in modes:
                out_dir = args.out / f"{regime}_{mode}_{repeat}"
                # The window is the online policy's knob: only the online modes take it.
                window = ["batching.policy.outstanding_depth=256"] * ONLINE.get(mode, False)
                summary = run_train(
                    out_dir,
                    [f"batching={mode}", f"data.source.regime={regime}", *window, *overrides],
                )
                runs[regime][mode].append(summary)
                print(
                    f"{regime:6s} {mode:10s} eff {summary['padding_efficiency']:.3f} "
                    f"steps {summary['steps_per_rank']:4d} "
                    f"{summary['emitted_samples_per_s']:.2f} samples/s",
                    flush=True,
                )
    table = {
        regime: {
            mode: {
                "padding_efficiency": found[0]["padding_efficiency"],
                "steps": found[0]["steps_per_rank"],
                "samples_per_s": statistics.median(s["emitted_samples_per_s"] for s in found),
                "real_tokens_per_s": statistics.median(s["real_tokens_per_s"] for s in found),
                "length_cache_s": found[0].get("length_cache_s"),
            }
            for mode, found in by_mode.items()
        }
        for regime, by_mode in runs.items()
    }
    report = {
        "regimes": table,
        "meta": results_meta(repeats=args.repeats, overrides=overrides),
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
