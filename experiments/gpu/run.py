"""One GPU, bf16 over float32 master weights: standard vs odb vs odb_packed vs odb+compile
at the Qwen2.5-0.5B shape on ShareGPT, FSDP2 steps of the 1.5B shape, and odb on
LLaVA-shaped image-text conversations at the Qwen2-VL-2B shape.

Each arm is one ``train.py``-equivalent run (``odb_lightning.app.train.run``, the code
path of ``python train.py trainer=gpu8 trainer.devices=1``: DDP on NCCL, ``bf16-mixed``,
a model initialised from config) in its own process, which reports the run summary (with
the step metrics: MFU from each step's own sample lengths, per-device rates, step times,
compile counts), the peak GPU memory and the device. The 0.5B arms train on the same
ShareGPT records, so on the same real tokens. This script prints the table and writes
``results.json`` next to itself.

    python -m experiments.gpu.run --prepare   # where PyPI is reachable: wheels/ (~30 MiB)
    python3 -m experiments.gpu.run            # the GPU machine, offline; < 8 min on an H200
    .venv/bin/python -m experiments.gpu.run --dry-run   # CPU, tiny model, same code path

``--dry-run`` swaps only what a CPU cannot run (accelerator, NCCL -> gloo, model width)
and writes ``runs/dry_run.json`` instead of ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.common import ROOT, results_meta
from experiments.gpu.packages import WHEELS, arm_environment, prepare_wheels

HERE = Path(__file__).resolve().parent
CHILD_FLAG = "--child"
ARM_FILE = "gpu_arm.json"
# Per arm: its trainer and model presets and its own overrides (after the shared ones).
ARMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "standard": ("gpu8", "qwen2_0_5b", ("batching=standard",)),
    "odb": ("gpu8", "qwen2_0_5b", ("batching=odb",)),
    "odb_packed": ("gpu8", "qwen2_0_5b", ("batching=odb_packed",)),
    "fsdp2_1_5b": ("gpu8_fsdp", "qwen2_5_1_5b", ("batching=odb",)),
    # Image-text: LLaVA-shaped easy-VQA conversations on the Qwen2-VL-2B shape.
    "qwen2_vl_2b": ("gpu8", "qwen2_vl_2b", ("batching=odb",)),
    # Last: its compile time is the least certain, and the time budget cuts from the end.
    "odb_compile": ("gpu8", "qwen2_0_5b", ("batching=odb", "model.runtime.compile=true")),
}
# What --dry-run changes so that the same path runs on a CPU in seconds.
DRY_RUN_OVERRIDES = [
    "trainer.accelerator=cpu",
    "trainer.strategy.process_group_backend=gloo",
    "model.architecture.hidden_size=64",
    "model.architecture.num_hidden_layers=1",
    "model.architecture.num_attention_heads=2",
    "model.architecture.num_key_value_heads=1",
    "model.architecture.intermediate_size=128",
    "model.architecture.token_id_fold=4096",
    "model.step.loss_chunk_tokens=1024",
    "batching.loader.num_workers=1",
]


VLM_ARMS = {"qwen2_vl_2b"}
"""Arms on the image-text data (``experiment=llava_odb``) instead of ShareGPT."""
# What --dry-run also changes in a vision arm: a tower a CPU runs in seconds.
DRY_RUN_VISION = [
    "model.vision.depth=1",
    "model.vision.embed_dim=32",
    "model.vision.num_heads=2",
    "model.vision.mrope_section=null",
]


def _online(own: tuple[str, ...]) -> bool:
    """The arm's batching mode forms its batches online."""
    # Imported here, as the child's run is: the parent may start before the package is
    # installed (packages.py installs it).
    from odb_lightning.core.modes import MODES

    mode = next(o.removeprefix("batching=") for o in own if o.startswith("batching="))
    return MODES[mode].policy.online


def arm_overrides(arm: str, args: argparse.Namespace, out_dir: Path) -> list[str]:
    """Hydra overrides of one arm (the same data, budget and settings for every arm)."""
    trainer, model, own = ARMS[arm]
    fsdp = trainer == "gpu8_fsdp"
    vlm = arm in VLM_ARMS
    if vlm:  # its own set (written under the run directory), length and record count
        data = [
            "experiment=llava_odb",
            f"data.caches.image_set_dir={out_dir.parent / 'vlm_sets'}",
            f"data.sizes.max_samples={args.vlm_samples}",
        ]
    else:
        data = [
            "experiment=sharegpt_odb",
            f"data.source.regime={args.regime}",
            f"data.sizes.max_seq_len={args.max_seq_len}",
            f"data.sizes.max_samples={args.fsdp_samples if fsdp else args.samples}",
        ]
    overrides = [
        *data,
        f"trainer={trainer}",
        "trainer.devices=1",
        f"model={model}",
        f"model.architecture.attn_implementation={args.attn}",
        "logger=csv",
        "data.sizes.val_samples=0",
        f"batching.loader.num_workers={args.num_workers}",
        f"data.caches.length_dir={out_dir.parent / 'length_cache'}",
        f"batching.token_budget={args.token_budget}",
        # The window is the online policy's knob: only the online arms take it.
        *([f"batching.policy.outstanding_depth={args.outstanding_depth}"] * _online(own)),
        # No checkpoint (GBs of optimizer state for a 0.5B model) in the arms' time.
        "~callbacks.checkpoint",
        "trainer.enable_checkpointing=false",
        f"hydra.run.dir={out_dir}",
        *own,
    ]
    if fsdp:
        overrides.append(f"trainer.max_steps={args.fsdp_steps}")
    if args.peak_tflops is not None:
        overrides.append(f"callbacks.step_metrics.peak_tflops={args.peak_tflops}")
    if not args.dry_run:
        return overrides
    return overrides + DRY_RUN_OVERRIDES + (DRY_RUN_VISION if vlm else [])


def run_child(overrides: list[str]) -> None:
    """Train one arm in this process, then write its summary and peak memory."""
    import hydra
    import torch
    from omegaconf import DictConfig

    from odb_lightning.app.train import run

    @hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="train")
    def train_arm(cfg: DictConfig) -> None:
        summary = run(cfg)
        cuda = torch.cuda.is_available()
        facts = {
            "summary": summary,
            "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
        Path(cfg.paths.output_dir, ARM_FILE).write_text(json.dumps(facts, indent=2))

    sys.argv = [sys.argv[0], *overrides]
    train_arm()


def arm_row(facts: dict[str, Any]) -> dict[str, Any]:
    """Throughput, memory, MFU and compile counts of one arm, from its run summary. MFU
    and model TFLOP/s are the step metrics': model FLOPs of each step's real samples at
    their own lengths over the training wall time (padding, attention across a packed
    row's samples and IDLE batches are the device's work, not model FLOPs)."""
    s = facts["summary"]
    keys = (
        "real_tokens_per_s", "padded_tokens_per_s", "padding_efficiency", "wall_s",
        "real_tokens", "padded_tokens", "loss_tokens", "emitted_samples", "loader_wait_share",
        "mfu", "model_tflops_per_s_per_device", "step_time_mean_s", "step_time_max_s",
        "compile_graphs", "compile_recompiles", "compile_s",
    )  # fmt: skip
    row = {key: s.get(key) for key in keys}
    row["samples_per_s"] = s["emitted_samples_per_s"]
    row["steps"] = s["optimizer_steps"]
    row["model_tflops_per_s"] = s.get("model_tflops_per_s_per_device")
    for key in ("peak_memory_gib", "peak_reserved_gib", "peak_host_rss_gib"):
        row[key] = facts[key]
    return row


def run_arm(command: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """Run one arm in its own process group; on timeout, kill the group (its loader
    workers too). The exit status (``None``: timed out) and the output's tail."""
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as child:
        try:
            output, _ = child.communicate(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            output, _ = child.communicate()
            return None, output[-6000:]
    return child.returncode, output[-6000:]


def compile_knob_exists() -> bool:
    """The model config has the ``compile`` knob (``model.runtime.compile=true``)."""
    import dataclasses

    from odb_lightning.lit.model.config import ModelRuntime

    return "compile" in {field.name for field in dataclasses.fields(ModelRuntime)}


def run_arms(args: argparse.Namespace) -> dict[str, Any]:
    """Run the arms one after the other; the report is rewritten after each arm, so a run
    cut short still leaves the arms it finished."""
    out = args.out / ("dry_run" if args.dry_run else "arms")
    env = arm_environment(args.out / "site")
    rows: dict[str, Any] = {}
    arms_facts: dict[str, Any] = {}
    started = time.perf_counter()
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in ARMS:
            raise SystemExit(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")
    for arm in arms:
        left_s = args.time_budget_s - (time.perf_counter() - started)
        if arm == "odb_compile" and not compile_knob_exists():
            rows[arm] = {"skipped": "no `compile` field in ModelRuntime (model.runtime)"}
        elif left_s < 30:
            rows[arm] = {"skipped": f"time budget of {args.time_budget_s:.0f} s spent"}
        if arm in rows:
            print(f"{arm}: skipped ({rows[arm]['skipped']})", flush=True)
            continue
        out_dir = out / arm
        (out_dir / ARM_FILE).unlink(missing_ok=True)
        command = [sys.executable, "-m", "experiments.gpu.run", CHILD_FLAG]
        arm_started = time.perf_counter()
        status, tail = run_arm(command + arm_overrides(arm, args, out_dir), env, left_s)
        process_s = time.perf_counter() - arm_started
        if status != 0:
            why = "timed out" if status is None else f"exit {status}"
            rows[arm] = {"failed": f"{why} after {process_s:.0f} s", "output_tail": tail}
            print(f"{arm}: {rows[arm]['failed']}\n{tail[-3000:]}", flush=True)
        else:
            arms_facts[arm] = json.loads((out_dir / ARM_FILE).read_text())
            rows[arm] = {**arm_row(arms_facts[arm]), "process_s": process_s}
            print(f"{arm}: done in {process_s:.0f} s", flush=True)
        if arms_facts:
            partial = len(rows) < len(arms)
            write_report(args, build_report(args, rows, arms_facts, started, partial))
    if not arms_facts:
        raise SystemExit(f"no arm ran: {json.dumps(rows, indent=2)[-4000:]}")
    return build_report(args, rows, arms_facts, started, partial=False)


def build_report(
    args: argparse.Namespace,
    rows: dict[str, Any],
    arms_facts: dict[str, Any],
    started: float,
    partial: bool,
) -> dict[str, Any]:
    """The report of the arms run so far (``rows``: every arm's row, skip or failure)."""
    out = args.out / ("dry_run" if args.dry_run else "arms")
    first = next(iter(arms_facts.values()))
    base = rows.get("standard", {}).get("real_tokens_per_s")
    for arm, row in rows.items():
        if "real_tokens_per_s" in row:
            comparable = base and ARMS[arm][1] == ARMS["standard"][1]
            row["vs_standard"] = row["real_tokens_per_s"] / base if comparable else None
    peak = first["summary"].get("peak_tflops_per_device")
    status = (
        "dry run (CPU, tiny model): checks the code path, not a measurement"
        if args.dry_run
        else "measured"
    )
    return {
        "status": f"{status} (partial: still running or cut short)" if partial else status,
        "arms": rows,
        "meta": results_meta(
            device=first["device"],
            peak_bf16_flops=None if peak is None else peak * 1e12,
            cuda=first["cuda"],
            torch_in_arms=first["torch"],
            wall_s=time.perf_counter() - started,
            time_budget_s=args.time_budget_s,
            overrides={arm: arm_overrides(arm, args, out / arm) for arm in args.arms.split(",")},
            host=platform.node(),
        ),
    }


def write_report(args: argparse.Namespace, report: dict[str, Any]) -> Path:
    target = args.out / "dry_run.json" if args.dry_run else HERE / "results.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    # A device runner that returns only what lands under $OUT gets a copy there too.
    out = os.environ.get("OUT")
    if out and not args.dry_run:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(target.read_text())
    return target


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['meta']['device']}  ({report['status']})")
    header = f"{'arm':11s} {'tokens/s':>10s} {'samples/s':>10s} {'pad eff':>8s} {'steps':>6s}"
    print(header + f" {'peak GiB':>9s} {'MFU':>6s} {'recomp':>6s} {'vs std':>7s}")
    for arm, row in report["arms"].items():
        if "real_tokens_per_s" not in row:
            print(f"{arm:11s} {row.get('skipped') or row.get('failed')}")
            continue
        mfu = row["mfu"]
        print(
            f"{arm:11s} {row['real_tokens_per_s']:10.0f} {row['samples_per_s']:10.2f} "
            f"{row['padding_efficiency']:8.3f} {row['steps']:6d} "
            f"{_cell(row['peak_memory_gib'], '.1f'):>9s} "
            f"{'-' if mfu is None else f'{100 * mfu:.1f}%':>6s} "
            f"{_cell(row['compile_recompiles'], 'd'):>6s} "
            f"{_cell(row['vs_standard'], '.2f'):>6s}x"
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help=f"fetch the wheels into {WHEELS}")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, seconds")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    parser.add_argument("--regime", default="mix", help="ShareGPT whole, first_exchange, mix")
    parser.add_argument("--samples", type=int, default=None, help="records (default 1500)")
    parser.add_argument("--fsdp-samples", type=int, default=None, help="default 256")
    parser.add_argument("--fsdp-steps", type=int, default=1, help="optimizer steps, FSDP2 arm")
    parser.add_argument("--vlm-samples", type=int, default=None, help="default 384")
    parser.add_argument("--token-budget", type=int, default=None, help="default 16384")
    parser.add_argument("--outstanding-depth", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=None, help="default 4096")
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument(
        "--attn",
        default="sdpa",
        help="attention backend of every arm (flash_attention_2 where flash-attn is "
        "installed: odb_packed then runs the varlen kernel)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="device bf16 peak")
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=450.0,
        help="arms left when it is spent are skipped; a running one is stopped at it",
    )
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    args = parser.parse_args(argv)
    # The dry run keeps the arms and the code path and shrinks the work to seconds.
    small = args.dry_run
    args.samples = args.samples or (48 if small else 1500)
    args.fsdp_samples = args.fsdp_samples or (16 if small else 256)
    args.vlm_samples = args.vlm_samples or (24 if small else 384)
    args.token_budget = args.token_budget or (4096 if small else 16384)
    args.max_seq_len = args.max_seq_len or (1024 if small else 4096)
    if small:
        args.outstanding_depth = min(args.outstanding_depth, 32)
    return args


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        run_child(sys.argv[2:])
        return
    args = parse_args(sys.argv[1:])
    if args.prepare:
        wheels = prepare_wheels()
        size = sum(w.stat().st_size for w in wheels) / 2**20
        print(f"{len(wheels)} wheels, {size:.1f} MiB in {WHEELS}:")
        print("\n".join(f"  {w.name}" for w in wheels))
        return
    report = run_arms(args)
    print_table(report)
    print(f"wrote {write_report(args, report)}")


if __name__ == "__main__":
    main()
