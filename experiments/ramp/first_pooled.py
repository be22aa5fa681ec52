"""Seconds to the first step and the wait of the step after the ramp, at several CPU ranks,
grouping across ranks (pooled, the default) against each rank on its own (per rank).

Each rank is a process with one intra-op thread, a gloo group and an ``ODBLoader`` (one
worker, forked) over ShareGPT V3 whole conversations (the Qwen2.5 ChatML template,
``max_seq_len`` 4,096), default batching settings except the budget. Each step it stands
for an accelerator's step: it sleeps ``--step-s`` seconds (the host's cores stay free for
the loader, as while a GPU computes; a CPU model trained on the same 2 cores takes seconds
a step and hides every fill) and all-reduces a small tensor, so the ranks move in step as
a job's do; ``--step-s 0`` trains ``model=cpu_bench`` instead (forward, backward, the
gradients all-reduced as DDP does, AdamW). The clock starts after a barrier, before
``iter(loader)``; per step it times how long the rank waited for its batch. The job stops
``--steps-after`` steps after the step after the ramp (the first step of the first
round past the ramp's rounds, ``core.ramp.ramp_targets``), the same step on every rank.

Per job, over the ranks: ``first_step_s`` (the longest wait for the first batch: the
loader's processes, the ramp's first window, its round), ``after_ramp_wait_s`` (the
longest wait for the step after the ramp: what the ramp's steps did not hide of the first
full window's fill and round), ``after_ramp_at_s`` (when that step arrived),
``ramp_train_s`` (the ramp's steps' training, the slowest rank's), and to step
``--steps`` (40, past every ramp) ``idle_s`` (the waits summed, each step's longest: the
time the accelerator stood idle) and ``at_step_s`` (when that step arrived).

    python -m experiments.ramp.first_pooled --worlds 2,4 --repeats 3 [--before PATH/src]

``--before`` runs every job a second time with ``PYTHONPATH=PATH/src`` (another checkout
of the package, e.g. a git worktree of an earlier commit): jobs are interleaved (per
repeat and world, every tree and arm, the order rotated each repeat) and each is its own
``python`` process. Medians over ``--repeats`` go into ``first_pooled.json``.
``--trace DIR`` also writes each collate process's phases (the window's fill, each round's
report, the pooled plan, the moves) to ``DIR/rank<r>.jsonl``, for a look at one job.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.throughput.two_ranks import collect_ranks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARMS = {"pooled": {}, "per_rank": {"cross_rank_grouping": False}}
"""``pooled``: the defaults (grouping across ranks, dealt by need with join);
``per_rank``: ``cross_rank_grouping=false``."""
MAX_SEQ_LEN = 4096


def _trace(directory: str, rank: int) -> None:
    """Log the collate process's phases to ``directory/rank<rank>.jsonl`` (absolute
    ``time.perf_counter`` seconds: one clock for every process of the machine)."""
    from odb_lightning.core import pooling, window
    from odb_lightning.runtime import engine

    path = Path(directory) / f"rank{rank}.jsonl"
    path.unlink(missing_ok=True)

    def wrap(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                with path.open("a") as handle:
                    handle.write(json.dumps([label, start, time.perf_counter()]) + "\n")

        setattr(owner, name, timed)

    wrap(engine.EpochRunner, "_fill", "fill")
    wrap(engine.EpochRunner, "_align", "round")
    wrap(engine.EpochRunner, "_move", "move")
    wrap(window.GroupingWindow, "make_report", "report")
    wrap(pooling.PooledRound, "plan", "pool_plan")


def _rank(rank: int, world: int, port: int, arm: str, args: argparse.Namespace, queue) -> None:
    import torch
    import torch.distributed as dist

    from experiments.cpu_bench import build_cpu_bench
    from odb_lightning.core.config import BatchingConfig
    from odb_lightning.core.loss_weights import rank_loss_scale
    from odb_lightning.core.ramp import ramp_targets
    from odb_lightning.runtime import ODBLoader

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        if args.trace:
            _trace(args.trace, rank)
        model = build_cpu_bench(0) if not args.step_s else torch.nn.Linear(8, 8)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        params = [p for p in model.parameters() if p.requires_grad]
        config = BatchingConfig.of(mode="odb", token_budget=args.budget, **ARMS[arm])
        ramp_rounds = len(ramp_targets(config.policy))
        dataset = _DATA["dataset"]
        dataset[0]  # the worker forks with the tokenizer loaded, as a run's does
        waits: list[float] = []
        arrived: list[float] = []
        compute: list[float] = []
        rounds: list[int] = []
        after_ramp = None
        with ODBLoader(
            dataset, config, num_workers=1, max_seq_len=MAX_SEQ_LEN, pad_id=_DATA["pad_id"]
        ) as loader:
            dist.barrier()
            started = time.perf_counter()
            batches = iter(loader)
            while (
                after_ramp is None
                or len(waits) <= after_ramp + args.steps_after
                or len(waits) < args.steps
            ):
                waited = time.perf_counter()
                batch = next(batches)
                waits.append(time.perf_counter() - waited)
                arrived.append(time.perf_counter() - started)
                if not rounds or rounds[-1] != batch.meta.round_index:
                    rounds.append(batch.meta.round_index)
                    if len(rounds) == ramp_rounds + 1:
                        after_ramp = len(waits) - 1
                computing = time.perf_counter()
                if args.step_s:
                    time.sleep(args.step_s)
                elif not batch.meta.is_idle:
                    loss_sum, _ = model(batch.inputs)
                    scale = rank_loss_scale(world, batch.meta.global_loss_tokens)
                    (loss_sum * scale).backward()
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat)
                offset = 0
                for p in params:
                    p.grad = flat[offset : offset + p.numel()].view_as(p) / world
                    offset += p.numel()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                compute.append(time.perf_counter() - computing)
        queue.put(
            (
                "ok",
                rank,
                {
                    "waits": waits,
                    "arrived": arrived,
                    "compute": compute,
                    "after_ramp": after_ramp,
                    "ramp_rounds": ramp_rounds,
                    "started": started,
                },
            )
        )
    except Exception as error:  # reported to the parent, which raises
        queue.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        dist.destroy_process_group()


_DATA: dict[str, Any] = {}


def run_job(world: int, arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """One job of ``world`` ranks; its figures over the ranks."""
    import torch.distributed as dist

    from odb_lightning.data import ChatDataset, load_tokenizer
    from odb_lightning.data.sources import load_source

    tokenizer = load_tokenizer("qwen2.5")
    _DATA["dataset"] = ChatDataset(
        load_source("sharegpt").records, tokenizer, max_seq_len=MAX_SEQ_LEN
    )
    _DATA["pad_id"] = tokenizer.pad_id
    context = multiprocessing.get_context("fork")
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    queue = context.Queue()
    ranks = [
        context.Process(target=_rank, args=(r, world, store.port, arm, args, queue))
        for r in range(world)
    ]
    records = collect_ranks(ranks, queue, arm, args.timeout_s, join_s=60)
    after = records[0]["after_ramp"]
    if any(r["after_ramp"] != after for r in records):
        raise RuntimeError(f"ranks disagree on the step after the ramp: {records}")
    waits = [max(w) for w in zip(*(r["waits"] for r in records), strict=True)]
    return {
        "first_step_s": max(r["waits"][0] for r in records),
        "idle_s": sum(waits[: args.steps]),
        "at_step_s": max(r["arrived"][args.steps - 1] for r in records),
        "after_ramp_step": after,
        "after_ramp_wait_s": max(r["waits"][after] for r in records),
        "after_ramp_at_s": max(r["arrived"][after] for r in records),
        "ramp_train_s": max(sum(r["compute"][:after]) for r in records),
        "waits_max_s": waits,
    }


def _job_in_subprocess(tree: str | None, world: int, arm: str, args: argparse.Namespace):
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "experiments.ramp.first_pooled", "--job", f"{world}:{arm}",
        "--budget", str(args.budget), "--steps-after", str(args.steps_after),
        "--step-s", str(args.step_s), "--steps", str(args.steps),
        "--timeout-s", str(args.timeout_s),
    ]  # fmt: skip
    if args.trace:
        command += ["--trace", args.trace]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        where = tree or "this tree"
        raise RuntimeError(f"job {world}:{arm} ({where}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--steps-after", type=int, default=2)
    parser.add_argument(
        "--steps", type=int, default=40, help="run to this step at least: idle_s, at_step_s"
    )
    parser.add_argument(
        "--step-s", type=float, default=1.0, help="an accelerator's step; 0: train cpu_bench"
    )
    parser.add_argument("--before", help="another checkout's src/, run side by side")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--trace", help="a directory for the collate processes' phases")
    parser.add_argument("--job", help=argparse.SUPPRESS)  # WORLD:ARM, one job, JSON out
    parser.add_argument("--out", type=Path, default=HERE / "first_pooled.json")
    args = parser.parse_args()
    if args.job:
        world, arm = args.job.split(":")
        print(json.dumps(run_job(int(world), arm, args)), flush=True)
        return
    from experiments.common import results_meta

    trees = {"after": None} if args.before is None else {"before": args.before, "after": None}
    worlds = [int(w) for w in args.worlds.split(",")]
    cells = [(tree, arm) for tree in trees for arm in args.arms.split(",")]
    jobs: dict[str, list[dict]] = {}
    loads: list[list[float]] = []
    for repeat in range(args.repeats):
        for world in worlds:
            shift = repeat % len(cells)
            for tree, arm in cells[shift:] + cells[:shift]:
                loads.append(list(os.getloadavg()))
                figures = _job_in_subprocess(trees[tree], world, arm, args)
                jobs.setdefault(f"{world}:{tree}:{arm}", []).append(figures)
                print(
                    f"repeat {repeat} ranks {world} {tree} {arm}: first step "
                    f"{figures['first_step_s']:.2f} s, step after the ramp "
                    f"(#{figures['after_ramp_step']}) waited {figures['after_ramp_wait_s']:.2f} s,"
                    f" arrived at {figures['after_ramp_at_s']:.2f} s; idle to step "
                    f"{args.steps} {figures['idle_s']:.2f} s; load {loads[-1]}",
                    flush=True,
                )
    keys = (
        "first_step_s",
        "after_ramp_step",
        "after_ramp_wait_s",
        "after_ramp_at_s",
        "ramp_train_s",
        "idle_s",
        "at_step_s",
    )
    medians = {
        cell: {key: statistics.median(j[key] for j in runs) for key in keys}
        for cell, runs in jobs.items()
    }
    result = {
        "meta": results_meta(
            budget=args.budget, step_s=args.step_s, trees=trees, repeats=args.repeats
        ),
        "load_averages": loads,
        "median": medians,
        "jobs": jobs,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for cell, row in medians.items():
        print(cell, {k: round(v, 2) for k, v in row.items()})


if __name__ == "__main__":
    main()
