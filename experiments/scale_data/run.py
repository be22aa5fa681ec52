"""The data path at the user's scale: start-up, first step and memory against the file size.

For each size (``--sizes``, default 10k,100k,1M records of the case study's length profile
at ``--length-scale``, written once by :mod:`experiments.scale_data.generate`), each
rank count (``--ranks``: ``trainer=cpu`` / ``trainer=ddp_cpu``) and each arm
(``--arms``): ``odb`` and ``standard`` are ``python train.py data=jsonl
data.source.path=<file> batching=<arm>`` with the tiny ``model=cpu_bench`` for
``--max-steps`` optimizer steps, W&B offline; ``reference`` is the reference package's
loader on the same file (:mod:`experiments.scale_data.reference_run`). Per run:

* **conversion**: the ``odb`` arm runs first with every cache of the size cleared
  (``cold``: the file's directory holds nothing but the file, ``paths.root_dir/.cache``
  is empty) and then again (``warm``); ``conversion_s`` is the cold run's time to the
  first step minus the warm run's. Every other run is warm.
* **start-up**: job start (the launcher's clock just before it starts the first process)
  to the first training batch requested (the first epoch starts), slowest rank.
* **first step**: job start to the end of the first optimizer step, slowest rank
  (:class:`experiments.scale_data.probe.StartupProbe`, added through
  ``+callbacks.scale_probe``).
* **PSS**: proportional set size of each rank's whole process tree (its main process,
  loader workers, collate process; W&B's service counts to rank 0), summed per rank every
  ``--sample-s`` seconds by a watcher thread (psutil ``memory_full_info().pss``); the
  peak of the largest rank.

Also ``odb-plan --source jsonl`` on every size: wall time and peak PSS (``--plan-sizes``).
Results go to ``results.json`` (merged by size, arm, ranks and cache state, so sizes can
be run one at a time) with the command, machine, git commit and the load average before
each run; the table is printed.

    python -m experiments.scale_data.run --sizes 10k,100k
    python -m experiments.scale_data.run --quick          # 10k, 2 steps
    python -m experiments.scale_data.run --from-results   # print the table
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from experiments.common import ROOT, bench_lock, results_meta, train_command
from experiments.scale_data.generate import write_jsonl

HERE = Path(__file__).resolve().parent
ARMS = ("odb", "standard", "reference")
CASE_STUDY_BUDGET, CASE_STUDY_MAX_LEN = 49_152, 8192
MIB = 1 << 20
RECORDS = Path(".cache", "odb_lightning", "records")  # under paths.root_dir, as conf/data


def parse_size(text: str) -> int:
    """``10k`` -> 10,000; ``1M`` -> 1,000,000; ``2500`` -> 2,500."""
    text = text.strip()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def size_label(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


# -- memory of a process tree -------------------------------------------------------------
def rank_of(process: psutil.Process) -> int:
    """The rank a process works for: its ``LOCAL_RANK`` (then ``RANK``) at exec, inherited by
    the loader processes it starts; rank 0's main process has neither."""
    env = process.environ()
    return int(env.get("LOCAL_RANK", env.get("RANK", "0")))


class TreeWatcher(threading.Thread):
    """Samples the PSS of every process under ``roots``, summed per rank; keeps the peaks."""

    def __init__(self, roots: Sequence[int], interval_s: float) -> None:
        super().__init__(daemon=True)
        self.roots, self.interval_s = list(roots), interval_s
        self.peak_by_rank: dict[int, int] = {}
        self.peak_total = 0
        self.max_processes = 0
        self.samples = 0
        self._stopping = threading.Event()
        self._ranks: dict[int, int] = {}

    def _tree(self) -> list[psutil.Process]:
        processes = []
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                processes += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return processes

    def sample(self) -> None:
        by_rank: dict[int, int] = {}
        processes = self._tree()
        for process in processes:
            try:
                rank = self._ranks.setdefault(process.pid, rank_of(process))
                pss = process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            by_rank[rank] = by_rank.get(rank, 0) + pss
        for rank, pss in by_rank.items():
            self.peak_by_rank[rank] = max(self.peak_by_rank.get(rank, 0), pss)
        self.peak_total = max(self.peak_total, sum(by_rank.values()))
        self.max_processes = max(self.max_processes, len(processes))
        self.samples += 1

    def run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stopping.set()
        self.join()


# -- one job ------------------------------------------------------------------------------
@dataclass
class Job:
    """The processes of one run (one per rank for the reference, one for ``train.py``,
    whose launcher starts the other ranks) and where their output goes."""

    commands: list[list[str]]
    envs: list[dict[str, str]]
    run_dir: Path
    timeout_s: float
    figures: dict[str, Any] = field(default_factory=dict)

    def run(self, sample_s: float) -> dict[str, Any]:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        logs = [(self.run_dir / f"process{i}.log").open("w") for i in range(len(self.commands))]
        started = time.time()
        processes = [
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            for command, env, log in zip(self.commands, self.envs, logs, strict=True)
        ]
        watcher = TreeWatcher([p.pid for p in processes], sample_s)
        watcher.start()
        timed_out = False
        deadline = started + self.timeout_s
        for process in processes:
            try:
                process.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)  # the run's own session
                    process.wait()
        ended = time.time()
        watcher.stop()
        for log in logs:
            log.close()
        return {
            "started": started,
            "wall_s": ended - started,
            "exit_codes": [p.returncode for p in processes],
            "timed_out": timed_out,
            "pss_peak_rank_mib": max(watcher.peak_by_rank.values(), default=0) / MIB,
            "pss_peak_by_rank_mib": {
                str(r): v / MIB for r, v in sorted(watcher.peak_by_rank.items())
            },
            "pss_peak_job_mib": watcher.peak_total / MIB,
            "max_processes": watcher.max_processes,
            "pss_samples": watcher.samples,
        }


def startup_figures(run_dir: Path, started: float, ranks: int) -> dict[str, Any]:
    """Seconds from job start to each mark, on the slowest rank, from the probes' files."""
    marks = []
    for rank in range(ranks):
        path = run_dir / f"startup_rank{rank}.json"
        if not path.is_file():
            return {"error": f"no {path.name}: the run did not reach its first step"}
        marks.append(json.loads(path.read_text())["marks"])
    figures: dict[str, Any] = {}
    for name, key in (
        ("startup_s", "first_batch_requested"),
        ("first_batch_s", "first_batch"),
        ("first_step_s", "first_step"),
    ):
        figures[name] = max(m[key] for m in marks) - started
    figures["window_fill_s"] = figures["first_step_s"] - figures["startup_s"]
    figures["first_step_s_by_rank"] = [m["first_step"] - started for m in marks]
    return figures


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the study ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    length_scale: float
    token_budget: int
    max_seq_len: int
    max_steps: int
    num_workers: int
    timeout_s: float
    sample_s: float
    runs_dir: Path


def train_job(arm: str, ranks: int, path: Path, root: Path, run_dir: Path, s: Settings) -> Job:
    overrides = [
        "data=jsonl",
        f"data.source.path={path}",
        f"data.sizes.max_seq_len={s.max_seq_len}",
        f"batching={arm}",
        f"batching.token_budget={s.token_budget}",
        f"batching.loader.num_workers={s.num_workers}",
        "model=cpu_bench",
        f"trainer={'cpu' if ranks == 1 else 'ddp_cpu'}",
        f"trainer.devices={ranks}",
        f"trainer.max_steps={s.max_steps}",
        f"paths.root_dir={root}",
        "experiment_name=scale_data",
        "+callbacks.scale_probe._target_=experiments.scale_data.probe.StartupProbe",
        f"+callbacks.scale_probe.output_dir={run_dir}",
    ]
    command = train_command(run_dir, overrides)
    return Job([command], [dict(os.environ)], run_dir, s.timeout_s)


def reference_job(ranks: int, path: Path, run_dir: Path, s: Settings) -> Job:
    command = [
        sys.executable, "-m", "experiments.scale_data.reference_run",
        "--path", str(path), "--output-dir", str(run_dir),
        "--token-budget", str(s.token_budget), "--max-seq-len", str(s.max_seq_len),
        "--num-workers", str(s.num_workers), "--max-steps", str(s.max_steps),
    ]  # fmt: skip
    port = str(free_port())
    envs = [
        dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(ranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )  # fmt: skip
        for r in range(ranks)
    ]
    return Job([command] * ranks, envs, run_dir, s.timeout_s)


def data_file(n: int, s: Settings) -> tuple[Path, dict[str, Any]]:
    """The size's file (written once, in a directory of its own) and its generation
    figures."""
    name = f"casestudy_{size_label(n)}_x{s.length_scale:g}"
    path = s.runs_dir / "data" / name / "casestudy.jsonl"
    summary_path = s.runs_dir / "data" / f"{name}.json"
    if not (path.is_file() and summary_path.is_file()):
        summary = write_jsonl(path, n, s.length_scale, seed=0)
        summary_path.write_text(json.dumps(summary))
    return path, json.loads(summary_path.read_text())


def clear_caches(path: Path, root: Path) -> None:
    """Everything a run may have cached for this file: beside it, and under the run's root."""
    for entry in path.parent.iterdir():
        if entry != path:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    shutil.rmtree(root / ".cache", ignore_errors=True)


def measure(job: Job, ranks: int, lock: Path | None, s: Settings) -> dict[str, Any]:
    load = os.getloadavg()
    with bench_lock(lock):
        row = job.run(s.sample_s)
    row["load_avg_1m_before"] = round(load[0], 2)
    if not row["timed_out"] and any(row["exit_codes"]):
        tail = (job.run_dir / "process0.log").read_text()[-3000:]
        row["error"] = f"exit {row['exit_codes']}: {tail}"
    figures = startup_figures(job.run_dir, row.pop("started"), ranks)
    if "error" in row and "error" in figures:
        figures.pop("error")  # the exit status and the log's tail say more
    row.update(figures)
    return row


def plan_row(n: int, path: Path, lock: Path | None, s: Settings) -> dict[str, Any]:
    """``odb-plan --source jsonl`` on the size's file: wall time and peak PSS."""
    run_dir = s.runs_dir / f"plan_{size_label(n)}"
    command = [
        sys.executable, "-m", "odb_lightning.app.plan", "--source", "jsonl",
        "--path", str(path), "--max-seq-len", str(s.max_seq_len),
        "--budget", str(s.token_budget), "--json",
        # The training runs' record table (paths.root_dir of the size): read, not converted.
        "--record-cache-dir", str(s.runs_dir / f"root_{size_label(n)}" / RECORDS),
    ]  # fmt: skip
    job = Job([command], [dict(os.environ)], run_dir, s.timeout_s)
    load = os.getloadavg()
    with bench_lock(lock):
        row = job.run(s.sample_s)
    row.pop("started")
    row["load_avg_1m_before"] = round(load[0], 2)
    log = (run_dir / "process0.log").read_text()
    try:
        report = json.loads(log[log.index("{") :])
        row["lengths"] = report["lengths"]
        row["steps"] = {
            mode: stats["steps"] for mode, stats in report["budgets"][0]["modes"].items()
        }
    except (ValueError, KeyError) as error:
        row["error"] = f"{error}: {log[-2000:]}"
    return {"records": n, "command": " ".join(command[1:]), **row}


def run_size(
    n: int, arms: Sequence[str], ranks_list: Sequence[int], lock: Path | None, s: Settings
) -> list[dict[str, Any]]:
    path, generated = data_file(n, s)
    label = size_label(n)
    root = s.runs_dir / f"root_{label}"
    rows = []

    def record(arm: str, ranks: int, cache: str, job: Job) -> dict[str, Any]:
        row = {"records": n, "arm": arm, "ranks": ranks, "cache": cache}
        row.update(measure(job, ranks, lock, s))
        rows.append(row)
        print(format_row(row), flush=True)
        return row

    if "odb" in arms:
        clear_caches(path, root)
        run_dir = s.runs_dir / f"{label}_odb_r1_cold"
        cold = record("odb", 1, "cold", train_job("odb", 1, path, root, run_dir, s))
    for ranks in ranks_list:
        for arm in arms:
            run_dir = s.runs_dir / f"{label}_{arm}_r{ranks}"
            if arm == "reference":
                job = reference_job(ranks, path, run_dir, s)
            else:
                job = train_job(arm, ranks, path, root, run_dir, s)
            row = record(arm, ranks, "warm", job)
            if arm == "odb" and ranks == 1 and "first_step_s" in cold and "first_step_s" in row:
                cold["conversion_s"] = cold["first_step_s"] - row["first_step_s"]
    for row in rows:
        row["file"] = {"bytes": generated["bytes"], "mean_tokens": generated["mean_tokens"]}
    return rows


# -- report -------------------------------------------------------------------------------
COLUMNS = (
    ("records", "records", "{:,}"),
    ("arm", "arm", "{}"),
    ("ranks", "ranks", "{}"),
    ("cache", "cache", "{}"),
    ("startup_s", "start-up s", "{:.1f}"),
    ("first_step_s", "first step s", "{:.1f}"),
    ("window_fill_s", "window fill s", "{:.1f}"),
    ("conversion_s", "conversion s", "{:.1f}"),
    ("pss_peak_rank_mib", "PSS/rank MiB", "{:,.0f}"),
    ("pss_peak_job_mib", "PSS job MiB", "{:,.0f}"),
    ("wall_s", "wall s", "{:.0f}"),
    ("load_avg_1m_before", "load", "{:.1f}"),
)


def format_row(row: dict[str, Any]) -> str:
    cells = [fmt.format(row[key]) if row.get(key) is not None else "" for key, _, fmt in COLUMNS]
    if "error" in row:
        cells.append("FAILED: " + row["error"].strip().splitlines()[-1][:120])
    return "| " + " | ".join(cells) + " |"


def print_table(results: dict[str, Any]) -> None:
    print("| " + " | ".join(title for _, title, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in results["rows"]:
        print(format_row(row))
    for row in results.get("plan", []):
        label, peak = size_label(row["records"]), row["pss_peak_job_mib"]
        print(f"odb-plan {label}: {row['wall_s']:.1f} s, peak PSS {peak:,.0f} MiB")


def merged(old: list[dict], new: list[dict], keys: Sequence[str]) -> list[dict]:
    replaced = {tuple(r.get(k) for k in keys) for r in new}
    kept = [r for r in old if tuple(r.get(k) for k in keys) not in replaced]
    return sorted(kept + new, key=lambda r: tuple(str(r.get(k)) for k in keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10k,100k,1M", help="records per file, e.g. 10k,100k,1M")
    parser.add_argument("--ranks", default="1,2", help="rank counts, e.g. 1,2")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"among {','.join(ARMS)}")
    parser.add_argument(
        "--plan-sizes", default=None, help="odb-plan on these sizes (default: --sizes)"
    )
    parser.add_argument("--quick", action="store_true", help="10k records, 2 steps")
    parser.add_argument(
        "--length-scale", type=float, default=0.125,
        help="the generator's length scale; the budget and max_seq_len scale with it",
    )  # fmt: skip
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--sample-s", type=float, default=0.5, help="PSS sampling period")
    parser.add_argument("--runs-dir", type=Path, default=HERE / "runs")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    parser.add_argument("--lock", type=Path, default=None, help="flock this file around each run")
    parser.add_argument("--from-results", action="store_true")
    args = parser.parse_args(argv)
    if args.from_results:
        print_table(json.loads(args.out.read_text()))
        return 0
    if args.quick:
        args.sizes, args.max_steps = "10k", 2
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not set(arms) <= set(ARMS):
        parser.error(f"--arms must be among {','.join(ARMS)}")
    sizes = [parse_size(t) for t in args.sizes.split(",") if t.strip()]
    plan_sizes = sizes if args.plan_sizes is None else [
        parse_size(t) for t in args.plan_sizes.split(",") if t.strip()
    ]  # fmt: skip
    settings = Settings(
        length_scale=args.length_scale,
        token_budget=round(CASE_STUDY_BUDGET * args.length_scale),
        max_seq_len=round(CASE_STUDY_MAX_LEN * args.length_scale),
        max_steps=args.max_steps,
        num_workers=args.num_workers,
        timeout_s=args.timeout_s,
        sample_s=args.sample_s,
        runs_dir=args.runs_dir,
    )
    ranks_list = [int(r) for r in args.ranks.split(",")]
    rows, plans = [], []
    for n in sizes:
        rows += run_size(n, arms, ranks_list, args.lock, settings)
        if n in plan_sizes:
            plans.append(plan_row(n, data_file(n, settings)[0], args.lock, settings))
            print(f"odb-plan {size_label(n)}: {plans[-1]['wall_s']:.1f} s", flush=True)
    old = json.loads(args.out.read_text()) if args.out.is_file() else {"rows": [], "plan": []}
    results = {
        "meta": results_meta(
            settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(settings).items()},
            model="cpu_bench (2 layers, 128 wide, token ids folded modulo 2,048)",
            load_avg_at_end=os.getloadavg(),
            memory_total_gib=psutil.virtual_memory().total / (1 << 30),
        ),
        "rows": merged(old["rows"], rows, ("records", "arm", "ranks", "cache")),
        "plan": merged(old.get("plan", []), plans, ("records",)),
        "earlier_meta": [old["meta"], *old.get("earlier_meta", [])][:4] if "meta" in old else [],
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
