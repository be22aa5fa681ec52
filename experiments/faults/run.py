"""Fault matrix, timed: each fault three times, at the loader level and in train.py.

Loader level (``testing.harness.fault_matrix``): ``ODBLoader`` on 2 real ranks
(gloo, 2 workers each), one fault on rank 1: a worker, the collate process or the whole
rank SIGKILLed after 2 batches, a sample that hangs (``timeout_s=2``) or raises (under
``on_bad_sample`` raise and skip). Recorded per run: each rank's error and the seconds
from the fault to it, the seconds until every process of the job had exited, and the
processes left running (by PID, recorded before the fault).

train.py level (``testing.harness.train_faults``): ``train.py debug=smoke
trainer=ddp_cpu`` with ``testing.harness.fault_injection.FaultInjectingModule``: an
exception in ``training_step`` on rank 1, rank 1 SIGKILLed, SIGTERM to rank 0, SIGINT to
the process group (Ctrl-C), all at training step 2. Recorded: exit code, the error lines of the
output, seconds from the fault until all 6 processes were gone, leftover PIDs.

    .venv/bin/python -m experiments.faults.run            # ~4 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from experiments.common import results_meta
from testing.harness.fault_matrix import matrix, run_fault
from testing.harness.train_faults import outcome_lines, run_train_fault

HERE = Path(__file__).resolve().parent

TRAIN_FAULTS = {  # name: (fault, rank)
    "training_step_raises": ("raise", 1),
    "rank_killed": ("kill", 1),
    "sigterm": ("sigterm", 0),
    "ctrl_c": ("sigint", 0),
}


def loader_runs(work: Path, repeats: int) -> dict:
    results = {}
    for fault in matrix():
        runs = []
        for attempt in range(repeats):
            result = run_fault(fault, work)
            runs.append(
                {
                    "errors": {
                        r: {"error": n, "message": m[:240]} for r, (n, m) in result.errors.items()
                    },
                    "seconds_to_error": {
                        r: round(s, 3) for r, s in result.seconds_to_error.items()
                    },
                    "seconds_to_all_gone": result.seconds_to_all_gone
                    and round(result.seconds_to_all_gone, 3),
                    "job_pids": result.job_pids,
                    "leftover_pids": result.leftover_pids,
                    "skipped_ids": {
                        r: list(e[0]["stats"].skipped_ids) for r, e in result.completed.items()
                    },
                    "as_expected": not result.mismatches,
                }
            )
            print(f"loader {fault.name} #{attempt + 1}: {runs[-1]['seconds_to_error']}", flush=True)
        results[fault.name] = {"runs": runs, **_maxima(runs)}
    return results


def _maxima(runs: list[dict]) -> dict:
    times = [t for run in runs for t in run["seconds_to_error"].values()]
    return {
        "max_seconds_to_error": max(times) if times else None,
        "max_seconds_to_all_gone": max(run["seconds_to_all_gone"] or float("inf") for run in runs),
        "max_leftover_processes": max(len(run["leftover_pids"]) for run in runs),
    }


def train_runs(work: Path, repeats: int) -> dict:
    results = {}
    for name, (fault, rank) in TRAIN_FAULTS.items():
        runs = []
        for attempt in range(repeats):
            result = run_train_fault(work / f"{name}-{attempt}", fault, rank)
            runs.append(
                {
                    "returncode": result.returncode,
                    "outcome_lines": outcome_lines(result.output),
                    "seconds_to_exit": result.seconds_to_exit and round(result.seconds_to_exit, 3),
                    "job_pids": len(result.job_pids),
                    "leftover_pids": result.leftover_pids,
                }
            )
            print(f"train.py {name} #{attempt + 1}: {runs[-1]['seconds_to_exit']} s", flush=True)
        results[name] = {
            "runs": runs,
            "max_seconds_to_exit": max(run["seconds_to_exit"] or float("inf") for run in runs),
            "max_leftover_processes": max(len(run["leftover_pids"]) for run in runs),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="odb-faults-") as work:
        results = {
            "meta": results_meta(repeats=args.repeats),
            "loader": loader_runs(Path(work), args.repeats),
            "train_py": train_runs(Path(work), args.repeats),
        }
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
