"""A stop inside the scheduler's grace, per phase: SIGTERM to rank 0 of the default 2-rank
job (``python train.py trainer=ddp_cpu``, i.e. ``experiment=sharegpt_odb``) beside one CPU
hog (``python -c "while True: pass"``), a few trials, each timed

    signal -> step boundary -> checkpoint saved -> rank 0 exits -> every process gone

from the marks :class:`~testing.harness.stop_marks.StopMarks` writes inside the run
(step boundaries, validation starts) and the lines of the run's output, stamped when they
arrive (``stopping on SIGTERM after optimizer step S: checkpoint ...``). The processes of
the job (both ranks, their loader workers and collate processes) are recorded just before
the signal; "every process gone" is when the last of them has exited. SLURM's default grace
between SIGTERM and SIGKILL is 30 s.

    .venv/bin/python -m experiments.stop_phases.run --label after            # this checkout
    .venv/bin/python -m experiments.stop_phases.run --label before --checkout <old checkout>

``--checkout`` runs another checkout's ``train.py`` (its ``src`` first on ``PYTHONPATH``;
it needs this checkout's ``testing/`` copied in). Results go to ``results.json``
under ``--label``: every trial, and the median and worst of each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from experiments.common import ROOT, results_meta
from testing.harness.processes import descendants, kill_leftovers, wait_all_gone

HERE = Path(__file__).resolve().parent
MARKS = "testing.harness.stop_marks.StopMarks"
STOPPED_LINE = re.compile(r"stopping on SIG\w+ after optimizer step (\d+)")
PHASES = (
    "signal_to_boundary_s",
    "boundary_to_checkpoint_s",
    "checkpoint_to_rank0_exit_s",
    "rank0_exit_to_all_gone_s",
    "boundary_to_all_gone_s",
    "signal_to_all_gone_s",
)


def read_marks(path: Path) -> list[dict[str, Any]]:
    marks = []
    for file in sorted(path.parent.glob(path.name + ".rank*")):
        marks += [json.loads(line) for line in file.read_text().splitlines() if line]
    return marks


def pump(stream: Any, lines: list[tuple[float, str]]) -> None:
    """Every line of ``stream`` with its arrival time (progress bars split on ``\\r``)."""
    for raw in iter(stream.readline, ""):
        now = time.time()
        lines.extend((now, part) for part in re.split(r"\r", raw.rstrip("\n")) if part)


def wait_for_step(marks_path: Path, step: int, process: subprocess.Popen, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        marks = read_marks(marks_path)
        if any(m["event"] == "step_end" and m["rank"] == 0 and m["step"] >= step for m in marks):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the run did not reach optimizer step {step} (exit {process.poll()})")


def trial(checkout: Path, work: Path, index: int, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = work / f"trial{index}"
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier study's marks would start it early
    marks_path = run_dir / "marks" / "stop"
    command = [
        sys.executable,
        str(checkout / "train.py"),
        "trainer=ddp_cpu",
        f"hydra.run.dir={run_dir}",
        f"+callbacks.stop_marks._target_={MARKS}",
        f"+callbacks.stop_marks.path={marks_path}",
        *args.overrides,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(checkout / "src")}
    process = subprocess.Popen(
        command,
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=pump, args=(process.stdout, lines), daemon=True)
    reader.start()
    try:
        wait_for_step(marks_path, args.signal_after_step, process, args.start_timeout_s)
        time.sleep(random.Random(index).uniform(0, 1.0))  # somewhere inside a step
        pids = [process.pid, *descendants(process.pid)]
        load = os.getloadavg()[0]
        t_signal = time.time()
        os.kill(process.pid, signal.SIGTERM)
        returncode = process.wait(timeout=args.exit_timeout_s)
        t_rank0_exit = time.time()
        gone_at, leftover = wait_all_gone(pids, args.exit_timeout_s)
        t_all_gone = time.time() - (time.monotonic() - gone_at) if gone_at else None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    kill_leftovers(leftover)
    reader.join(timeout=5)
    return measure(run_dir, marks_path, lines, t_signal, t_rank0_exit, t_all_gone) | {
        "returncode": returncode,
        "load_1min": round(load, 2),
        "job_processes": len(pids),
        "leftover_pids": leftover,
        "output_tail": [text[:300] for _, text in lines if "Error" in text or "stop" in text][-12:],
    }


def measure(run_dir, marks_path, lines, t_signal, t_rank0_exit, t_all_gone) -> dict[str, Any]:
    marks = read_marks(marks_path)
    after = [m for m in marks if m["t"] > t_signal]
    boundaries = {}
    for m in after:
        if m["event"] == "step_end":
            boundaries.setdefault(m["rank"], m["t"])
    t_boundary = max(boundaries.values()) if len(boundaries) == 2 else None
    stopped = [(t, STOPPED_LINE.search(text)) for t, text in lines if t > t_signal]
    stopped = [(t, int(m.group(1))) for t, m in stopped if m]
    t_checkpoint = stopped[-1][0] if stopped else None
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("stop-*"))
    last = run_dir / "checkpoints" / "last.ckpt"

    def span(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else round(end - start, 3)

    return {
        "signal_to_boundary_s": span(t_signal, t_boundary),
        "boundary_to_checkpoint_s": span(t_boundary, t_checkpoint),
        "checkpoint_to_rank0_exit_s": span(t_checkpoint, t_rank0_exit),
        "rank0_exit_to_all_gone_s": span(t_rank0_exit, t_all_gone),
        "boundary_to_all_gone_s": span(t_boundary, t_all_gone),
        "signal_to_all_gone_s": span(t_signal, t_all_gone),
        "stopped_after_step": stopped[-1][1] if stopped else None,
        "validation_after_signal": any(m["event"] == "validation_start" for m in after),
        "stop_checkpoints": checkpoints,
        "last_ckpt_links_to": os.readlink(last) if last.is_symlink() else None,
    }


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {}
    for phase in PHASES:
        values = [t[phase] for t in trials if t[phase] is not None]
        summary[phase] = {
            "median": round(statistics.median(values), 3) if values else None,
            "worst": max(values) if values else None,
            "measured": len(values),
        }
    loads = [t["load_1min"] for t in trials]
    summary["load_1min"] = {
        "min": min(loads),
        "median": statistics.median(loads),
        "max": max(loads),
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="key in results.json: before, after")
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--signal-after-step", type=int, default=3)
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--exit-timeout-s", type=float, default=180.0)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "stop_phases")
    parser.add_argument("--hogs", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    work = (args.work / args.label).resolve()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    trials: list[dict[str, Any]] = []
    try:
        for index in range(args.trials):
            trials.append(trial(checkout, work, index, args))
            print(json.dumps(trials[-1]), flush=True)
            write_results(args, checkout, trials)  # after each trial: a cut-short study counts
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(json.dumps(summarize(trials), indent=2))


def write_results(args: argparse.Namespace, checkout: Path, trials: list[dict[str, Any]]) -> None:
    out = HERE / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results[args.label] = {
        "meta": results_meta(checkout=str(checkout), hogs=args.hogs, overrides=args.overrides),
        "summary": summarize(trials),
        "trials": trials,
    }
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
