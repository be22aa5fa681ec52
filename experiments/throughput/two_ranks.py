"""Two-rank data parallelism on CPU: ODB vs the reference package vs fixed batches of 8.

    .venv/bin/python -m experiments.throughput.two_ranks --lock /tmp/odb_bench.lock

Two processes, each one intra-op thread and one loader worker, a gloo group between
them; the same ``model=cpu_bench`` stand-in, AdamW, clipping and exact token-weighted loss
as ``run.py``, on the same regimes with twice the samples (each rank trains as much as the
one-rank study's single process). Each step, the ranks all-reduce (has a batch, supervised
tokens) and then the summed gradients in one flat buffer, as DDP does; a rank without a
batch (an ODB IDLE step, or a reference rank whose shard ran out first) adds zeros, so
every arm pays the same collectives. Arms:

* ``odb``: our ``ODBLoader`` (default settings, ``outstanding_depth=256``; the job's
  metadata channel on the gloo group's store);
* ``reference``: ``odb.ODBDataLoader`` (``online-dynamic-batching==0.1.2``) with
  ``token_budget``, ``buffer_size=256``, ``no_warmup=True``, our ``pad_collate``, and a
  seeded ``DistributedSampler`` (it does not shard by itself);
* ``standard``: a plain ``DataLoader`` of 8 samples over the same ``DistributedSampler``
  (what the HF Trainer does).

Per run: samples/s and real tokens/s of the job (both ranks, over the slower rank's
clock, from building the loader to the last step), per-rank step times (forward and
backward, before the gradient all-reduce), the **measured sync efficiency** (per step the
mean of the two ranks' compute times over the larger, averaged over steps), the
**utilization** (real tokens over ``2 x`` the sum of each step's larger padded-token
count; an IDLE step costs 0), and beside it the simulator's prediction for the same shards
(``core.simulate.simulate_dealt_epoch`` on the loader's seeded order for odb; the
reference's own grouping, ``experiments.sync_efficiency.reference``, on its sampler's
shards; the fixed batches of the sampler's shards for standard). Arms interleaved per
regime and rotated per repeat; medians of ``--repeats``, ratios the median of the
per-repeat ratios. Results go into ``two_ranks.json`` next to this script.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from experiments.common import bench_lock, results_meta
from experiments.cpu_bench import build_cpu_bench
from experiments.throughput.run import ratio_text
from experiments.throughput.throughput_arms import (
    REGIMES,
    BenchData,
    load_bench_data,
    reference_batches,
)
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.loss_weights import rank_loss_scale
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.runtime.batch import pad_collate

HERE = Path(__file__).resolve().parent
WORLD = 2
ARMS = ("odb", "reference", "standard")
"""The default arms; on request also ``odb_no_ramp`` (the ramp off), ``odb_per_rank``
(``cross_rank_grouping=false``: each rank groups only its own samples) and
``odb_cross_rank`` (``cross_rank_grouping=true``, which the defaults apply to two ranks
dealt by need: samples move between the ranks)."""
ODB_ARMS = ("odb", "odb_no_ramp", "odb_per_rank", "odb_cross_rank")
DEFAULT_SAMPLES = {"whole": 128, "first_exchange": 352, "mix": 192, "chitchat": 224}
STANDARD_BATCH = 8


@dataclass(frozen=True)
class Settings:
    token_budget: int = 16384
    outstanding_depth: int = 256
    num_workers: int = 1
    max_seq_len: int = 4096
    seed: int = 0
    lr: float = 3e-4
    pad_id: int = 0
    attention_weight: float | None = None
    """Our loader's ``batching.rows.attention_weight`` (``None``: tokens only)."""
    architecture: tuple[str, ...] = ()
    """Hydra overrides of the ``cpu_bench`` model (``end_to_end.py``'s smaller body)."""


@dataclass
class RankRecord:
    """What one rank did in one epoch, counted from the model inputs it received."""

    wall_s: float = 0.0
    loader_wait_s: float = 0.0
    wait_s: list[float] = field(default_factory=list)  # per batch the loader yielded
    samples: int = 0
    real_tokens: int = 0
    loss_tokens: int = 0
    steps: int = 0  # the job's steps (this rank IDLE in some of them)
    idle_steps: int = 0
    compute_s: list[float] = field(default_factory=list)  # per job step; 0 when IDLE
    padded: list[int] = field(default_factory=list)  # per job step; 0 when IDLE
    lengths: list[int] = field(default_factory=list)  # every sample trained, in order
    moved_samples: int = 0  # run here, fetched by the other rank (odb_cross_rank)
    moved_bytes: int = 0


def _sampler(data: BenchData, rank: int, seed: int) -> DistributedSampler:
    sampler = DistributedSampler(
        data.dataset, num_replicas=WORLD, rank=rank, shuffle=True, seed=seed, drop_last=False
    )
    sampler.set_epoch(0)
    return sampler


def _batches(arm: str, data: BenchData, settings: Settings, rank: int, record: RankRecord):
    """Model inputs of one epoch of ``arm`` on this rank (``None`` for an IDLE step); an
    ODB arm's moved samples go into ``record`` at the epoch's end."""
    collate = functools.partial(pad_collate, pad_id=settings.pad_id)
    if arm in ODB_ARMS:
        from odb_lightning.runtime import ODBLoader

        config = _odb_config(settings, arm, num_workers=settings.num_workers)
        with ODBLoader(
            data.dataset, config, max_seq_len=settings.max_seq_len, pad_id=settings.pad_id
        ) as loader:
            for batch in loader:
                yield None if batch.meta.is_idle else batch.inputs
            stats = loader.last_epoch_stats
            record.moved_samples, record.moved_bytes = stats.moved_samples, stats.moved_bytes
        return
    if arm == "reference":
        yield from reference_batches(data, settings, _sampler(data, rank, settings.seed))
        return
    if arm == "standard":
        yield from DataLoader(
            data.dataset,
            batch_size=STANDARD_BATCH,
            sampler=_sampler(data, rank, settings.seed),
            num_workers=settings.num_workers,
            collate_fn=collate,
        )
        return
    raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")


def _odb_config(settings: Settings, arm: str, **knobs: Any) -> BatchingConfig:
    """Our loader's settings: the defaults with the study's budget and depth
    (``odb_no_ramp``: the window ramp off; ``odb_per_rank``: no grouping across ranks;
    ``odb_cross_rank``: grouping across ranks named explicitly)."""
    if arm == "odb_no_ramp":
        knobs["ramp_budgets"] = None
    if arm == "odb_per_rank":
        knobs["cross_rank_grouping"] = False
    if arm == "odb_cross_rank":
        knobs["cross_rank_grouping"] = True
    return BatchingConfig.of(
        mode="odb",
        token_budget=settings.token_budget,
        seed=settings.seed,
        outstanding_depth=settings.outstanding_depth,
        attention_weight=settings.attention_weight,
        **knobs,
    )


def _all_reduce_gradients(model: torch.nn.Module) -> None:
    """Sum every gradient over the ranks in one flat buffer (zeros where a rank has none),
    then divide by the world size, as DDP averages."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(WORLD)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def train_rank(arm: str, data: BenchData, settings: Settings, rank: int) -> RankRecord:
    model = build_cpu_bench(settings.seed, settings.architecture)
    model.configure_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.95))
    record = RankRecord()
    # The dataset came pickled: load its tokenizer here, before the clock, as the
    # one-rank study's process has it loaded (loader workers fork with it).
    data.dataset[0]
    dist.barrier()
    started = time.perf_counter()
    batches = _batches(arm, data, settings, rank, record)
    exhausted = False
    while True:
        waited = time.perf_counter()
        inputs = None if exhausted else next(batches, StopIteration)
        if inputs is StopIteration:
            exhausted, inputs = True, None
        record.loader_wait_s += time.perf_counter() - waited
        if not exhausted:
            record.wait_s.append(time.perf_counter() - waited)
        # (live ranks, has a batch, supervised tokens): one small all-reduce per step.
        loss_tokens = 0 if inputs is None else int((inputs["labels"][:, 1:] != -100).sum())
        flags = torch.tensor([int(not exhausted), int(inputs is not None), loss_tokens])
        dist.all_reduce(flags)
        live, with_batch, global_tokens = (int(v) for v in flags)
        if live == 0:
            break
        if with_batch == 0:  # every rank IDLE or exhausted here: not a step of the job
            continue
        compute_started = time.perf_counter()
        if inputs is not None:
            loss_sum, _ = model(inputs)
            (loss_sum * rank_loss_scale(WORLD, global_tokens)).backward()
            rows, row_length = inputs["input_ids"].shape
            lengths = inputs["attention_mask"].sum(dim=1).tolist()
            record.samples += rows
            record.real_tokens += sum(lengths)
            record.loss_tokens += loss_tokens
            record.padded.append(rows * row_length)
            record.lengths += lengths
        else:
            record.idle_steps += 1
            record.padded.append(0)
        record.compute_s.append(time.perf_counter() - compute_started)
        _all_reduce_gradients(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record.steps += 1
    dist.barrier()
    record.wall_s = time.perf_counter() - started
    return record


def rank_main(rank: int, port: int, arm: str, data: BenchData, settings: Settings, queue) -> None:
    torch.set_num_threads(1)
    # A rank forked by the forkserver inherits its start method; a rank that torchrun or
    # Lightning starts is a plain process whose loaders fork their workers.
    multiprocessing.set_start_method("fork", force=True)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        queue.put(("ok", rank, asdict(train_rank(arm, data, settings, rank))))
    except Exception as error:  # reported to the parent, which raises
        queue.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        dist.destroy_process_group()


def run_job(arm: str, data: BenchData, settings: Settings, timeout_s: float) -> list[dict]:
    """Both ranks of one epoch of ``arm``; their records, rank 0 first."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", __name__])
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    queue = context.Queue()
    ranks = [
        context.Process(target=rank_main, args=(r, store.port, arm, data, settings, queue))
        for r in range(WORLD)
    ]
    return collect_ranks(ranks, queue, arm, timeout_s, join_s=30)


def collect_ranks(
    ranks: list[Any], queue: Any, arm: str, timeout_s: float, join_s: float
) -> list[dict]:
    """Start the rank processes and return each one's ``("ok", rank, payload)`` payload by
    rank; a rank's failure (or no answer within ``timeout_s``) raises, and every process
    is joined (killed after ``join_s``) on the way out."""
    for process in ranks:
        process.start()
    results: dict[int, dict] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while len(results) < len(ranks):
            status, rank, payload = queue.get(timeout=max(1.0, deadline - time.monotonic()))
            if status != "ok":
                raise RuntimeError(f"{arm}: rank {rank} failed: {payload}")
            results[rank] = payload
    finally:
        for process in ranks:
            process.join(join_s)
            if process.is_alive():
                process.kill()
                process.join(5)
    return [results[r] for r in range(len(ranks))]


def job_figures(ranks: list[dict], data: BenchData) -> dict[str, Any]:
    """The job's rates, step times, measured sync efficiency and utilization."""
    steps = ranks[0]["steps"]
    if any(r["steps"] != steps for r in ranks):
        raise RuntimeError(f"ranks took different step counts: {[r['steps'] for r in ranks]}")
    samples = sum(r["samples"] for r in ranks)
    real = sum(r["real_tokens"] for r in ranks)
    if (samples, real) != (len(data.lengths), sum(data.lengths)):
        raise RuntimeError(f"trained on {(samples, real)}, expected the benchmark's samples")
    wall = max(r["wall_s"] for r in ranks)
    per_step = list(zip(*(r["compute_s"] for r in ranks), strict=True))
    padded = list(zip(*(r["padded"] for r in ranks), strict=True))
    return {
        "steps": steps,
        "idle_steps": [r["idle_steps"] for r in ranks],
        "wall_s": wall,
        "samples_per_s": samples / wall,
        "real_tokens_per_s": real / wall,
        "step_time_median_s": [statistics.median(r["compute_s"]) for r in ranks],
        "step_time_max_s": [max(r["compute_s"]) for r in ranks],
        "compute_s": [sum(r["compute_s"]) for r in ranks],
        "loader_wait_s": [r["loader_wait_s"] for r in ranks],
        "measured_sync_efficiency": statistics.fmean(
            statistics.fmean(times) / max(times) for times in per_step if max(times) > 0
        ),
        "utilization": real / (WORLD * sum(max(p) for p in padded)),
        "padding_efficiency": real / sum(sum(p) for p in padded),
        "moved_samples": sum(r["moved_samples"] for r in ranks),
        "moved_bytes": sum(r["moved_bytes"] for r in ranks),
    }


def _fixed_batch_figures(shards: list[list[int]]) -> dict[str, float]:
    """Utilization and step count of fixed batches of 8 over each rank's shard."""
    steps = max((len(s) + STANDARD_BATCH - 1) // STANDARD_BATCH for s in shards)
    costs = [
        [
            len(s[i : i + STANDARD_BATCH]) * max(s[i : i + STANDARD_BATCH], default=0)
            for i in range(0, STANDARD_BATCH * steps, STANDARD_BATCH)
        ]
        for s in shards
    ]
    real = sum(map(sum, shards))
    return {
        "steps": steps,
        "utilization": real / (WORLD * sum(max(c) for c in zip(*costs, strict=True))),
    }


def predictions(data: BenchData, settings: Settings) -> dict[str, dict[str, float]]:
    """What the simulator (and the reference's own grouping) predicts for these shards."""
    from experiments.sync_efficiency.reference import measure_reference

    lengths = data.lengths
    predicted = {}
    for arm in ODB_ARMS:
        config = _odb_config(settings, arm)
        order = epoch_permutation(len(lengths), config.seed, 0)
        result = simulate_dealt_epoch([lengths[i] for i in order], WORLD, config)
        predicted[arm] = {
            "steps": len(result.steps[0]),
            "utilization": result.sync.utilization,
            "sync_efficiency": result.sync.sync_efficiency,
        }
    shards = [[lengths[i] for i in _sampler(data, r, settings.seed)] for r in range(WORLD)]
    reference = measure_reference(shards, settings.token_budget, settings.outstanding_depth)
    return predicted | {
        "reference": {
            "steps": reference["steps_per_rank"],
            "utilization": reference["utilization"],
            "sync_efficiency": reference["sync_efficiency"],
        },
        "standard": _fixed_batch_figures(shards),
    }


def summarize(runs: dict[str, list[dict]], predicted: dict[str, dict]) -> dict[str, Any]:
    arms = {}
    for arm, jobs in runs.items():
        row = {
            key: statistics.median(job[key] for job in jobs)
            for key in (
                "samples_per_s",
                "real_tokens_per_s",
                "wall_s",
                "measured_sync_efficiency",
                "utilization",
                "padding_efficiency",
            )
        }
        row["steps"] = jobs[0]["steps"]
        row["step_time_median_s"] = [
            statistics.median(job["step_time_median_s"][r] for job in jobs) for r in range(WORLD)
        ]
        row["compute_s"] = [
            statistics.median(job["compute_s"][r] for job in jobs) for r in range(WORLD)
        ]
        row["loader_wait_s"] = [
            statistics.median(job["loader_wait_s"][r] for job in jobs) for r in range(WORLD)
        ]
        row["idle_steps"] = jobs[0]["idle_steps"]
        row["moved_samples"] = jobs[0].get("moved_samples", 0)
        row["moved_bytes"] = jobs[0].get("moved_bytes", 0)
        row["predicted"] = predicted[arm]
        arms[arm] = row
    for arm, jobs in runs.items():
        for base in ("standard", "reference"):
            if base in runs:
                ratios = [
                    a["samples_per_s"] / b["samples_per_s"]
                    for a, b in zip(jobs, runs[base], strict=True)
                ]
                arms[arm][f"vs_{base}"] = statistics.median(ratios)
                arms[arm][f"vs_{base}_per_repeat"] = ratios
    return {"arms": arms, "jobs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--samples",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_SAMPLES.items()),
        help="samples per regime (both ranks together)",
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per job, against a hang")
    parser.add_argument("--lock", type=Path, help="flock this file around each timed job")
    parser.add_argument("--out", type=Path, default=HERE / "two_ranks.json")
    parser.add_argument(
        "--predict-only", action="store_true",
        help="print the simulator's steps and utilization per arm (odb_no_ramp too); no training",
    )  # fmt: skip
    args = parser.parse_args()
    from odb_lightning.data import load_tokenizer

    settings = Settings(pad_id=load_tokenizer().pad_id)
    samples = {k: int(v) for k, v in (item.split("=") for item in args.samples.split(","))}
    regimes, arms = args.regimes.split(","), args.arms.split(",")
    report: dict[str, Any] = {}
    load_before = list(os.getloadavg())
    started = time.perf_counter()
    with bench_lock(args.lock):  # CPU-heavy (tokenization): kept off other timed runs
        data = {
            r: load_bench_data(r, samples[r], 2000, settings.max_seq_len, settings.seed)
            for r in regimes
        }
    if args.predict_only:
        for regime in regimes:
            predicted = predictions(data[regime], settings)
            print(regime, ", ".join(
                f"{arm} {p['steps']} steps, utilization {p['utilization']:.3f}"
                for arm, p in predicted.items()
            ))  # fmt: skip
        return
    runs: dict[str, dict[str, list[dict]]] = {r: {a: [] for a in arms} for r in regimes}
    for repeat in range(args.repeats):
        for regime in regimes:
            for arm in arms[repeat % len(arms) :] + arms[: repeat % len(arms)]:
                with bench_lock(args.lock):
                    ranks = run_job(arm, data[regime], settings, args.timeout_s)
                job = job_figures(ranks, data[regime])
                job["load_average"] = list(os.getloadavg())
                runs[regime][arm].append(job)
                print(
                    f"repeat {repeat} {regime:14s} {arm:9s} {job['samples_per_s']:6.2f} samples/s"
                    f"  {job['steps']:3d} steps  sync {job['measured_sync_efficiency']:.3f}  "
                    f"util {job['utilization']:.3f}  {job['wall_s']:6.1f} s  "
                    f"load {job['load_average'][0]:.2f}",
                    flush=True,
                )
    with bench_lock(args.lock):
        for regime in regimes:
            report[regime] = summarize(runs[regime], predictions(data[regime], settings))
    meta = results_meta(
        world_size=WORLD,
        repeats=args.repeats,
        settings=asdict(settings),
        samples={r: len(data[r].lengths) for r in regimes},
        wall_s=time.perf_counter() - started,
        load_average_before=load_before,
        load_average_after=list(os.getloadavg()),
        model="conf/model/cpu_bench.yaml (token ids folded modulo token_id_fold)",
        intra_op_threads_per_rank=1,
    )
    args.out.write_text(json.dumps({"regimes": report, "meta": meta}, indent=2) + "\n")
    for regime, table in report.items():
        print(regime)
        for arm, row in table["arms"].items():
            pred = row["predicted"]
            print(
                f"  {arm:9s} {row['samples_per_s']:6.2f} samples/s {row['real_tokens_per_s']:7.0f}"
                f" tok/s  steps {row['steps']} (pred {pred['steps']})  util "
                f"{row['utilization']:.3f} (pred {pred['utilization']:.3f})  sync "
                f"{row['measured_sync_efficiency']:.3f}  moved {row['moved_samples']}  "
                f"vs ref {ratio_text(row.get('vs_reference'))}"
                f"  vs std {ratio_text(row.get('vs_standard'))}"
            )


if __name__ == "__main__":
    main()
