"""Time of the bucket-edge optimizer (``core.buckets.optimize_boundaries``) on a
ShareGPT-sized sample: 17,545 lognormal lengths (median 1,456, sigma 0.54), 6 buckets,
128 candidates, the seed settings of ``tests/unit/core/test_buckets.py``. The median and
the worst of ``--repeats`` runs. Run from the repository root:

    .venv/bin/python -m experiments.grouping.optimizer_time [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from odb_lightning.core.buckets import optimize_boundaries
from odb_lightning.core.profiles import lognormal_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lengths = lognormal_lengths(17545, 1456, 0.54, seed=0)
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        optimize_boundaries(lengths, 6, num_candidates=128, token_budget=49152, max_batch_size=64)
        seconds.append(time.perf_counter() - started)
    result = {"median_s": statistics.median(seconds), "max_s": max(seconds), "runs": seconds}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
