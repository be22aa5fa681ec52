"""One GPU, bf16, a Qwen2.5-0.5B-sized model: standard vs odb vs odb_packed on ShareGPT.

Each arm is one ``train.py``-equivalent run (``odb_lightning.app.train.run``, the code
path of ``python train.py trainer=gpu8 trainer.devices=1``: DDP on NCCL,
``bf16-mixed``, ``model=qwen2_0_5b`` initialised from config) over the same ShareGPT
records, so every arm trains on the same real tokens. Each arm runs in its own process,
which reports the run summary, the peak GPU memory and the device; this script prints
tokens/s, samples/s, peak memory and MFU, and writes ``results.json`` next to itself.

    .venv/bin/python -m experiments.gpu.run             # a CUDA machine; < 8 min on one H200
    .venv/bin/python -m experiments.gpu.run --dry-run   # CPU, tiny model, same code path

``--dry-run`` swaps only what a CPU cannot run (accelerator, NCCL -> gloo, model width)
and writes ``runs/dry_run.json`` instead of ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.common import ROOT, results_meta

HERE = Path(__file__).resolve().parent
ARMS = ("standard", "odb", "odb_packed")
CHILD_FLAG = "--child"
ARM_FILE = "gpu_arm.json"
# Dense bf16 tensor-core peak (no sparsity), FLOP/s, by a substring of the device name.
PEAK_BF16_FLOPS = {
    "H200": 989.4e12,
    "H100 SXM": 989.4e12,
    "H100 80GB HBM3": 989.4e12,
    "H100 PCIe": 756.0e12,
    "H100": 989.4e12,
    "A100": 312.0e12,
    "L40S": 362.05e12,
}
# What --dry-run changes so that the same path runs on a CPU in seconds.
DRY_RUN_OVERRIDES = [
    "trainer.accelerator=cpu",
    "trainer.strategy.process_group_backend=gloo",
    "model.hidden_size=64",
    "model.num_hidden_layers=1",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "model.intermediate_size=128",
    "model.token_id_fold=4096",
    "model.loss_chunk_tokens=1024",
    "batching.num_workers=1",
]


def arm_overrides(arm: str, args: argparse.Namespace, out_dir: Path) -> list[str]:
    """Hydra overrides of one arm (the same data, budget and model for every arm)."""
    overrides = [
        "experiment=sharegpt_odb",
        f"batching={arm}",
        "trainer=gpu8",
        "trainer.devices=1",
        "model=qwen2_0_5b",
        f"model.attn_implementation={args.attn}",
        "logger=csv",
        f"data.regime={args.regime}",
        f"data.max_seq_len={args.max_seq_len}",
        f"data.max_samples={args.samples}",
        "data.val_samples=0",
        f"batching.num_workers={args.num_workers}",
        f"data.length_cache_dir={out_dir.parent / 'length_cache'}",
        f"batching.token_budget={args.token_budget}",
        f"batching.outstanding_depth={args.outstanding_depth}",
        f"hydra.run.dir={out_dir}",
    ]
    return overrides + (DRY_RUN_OVERRIDES if args.dry_run else [])


def run_child(overrides: list[str]) -> None:
    """Train one arm in this process, then write its summary and peak memory."""
    import hydra
    import torch
    from omegaconf import DictConfig
    from transformers import Qwen2Config

    from odb_lightning.app.train import run
    from odb_lightning.lit.flops import flops_per_token

    @hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="train")
    def train_arm(cfg: DictConfig) -> None:
        summary = run(cfg)
        m = cfg.model
        config = Qwen2Config(
            vocab_size=m.token_id_fold or m.vocab_size,
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            intermediate_size=m.intermediate_size,
        )
        cuda = torch.cuda.is_available()
        facts = {
            "summary": summary,
            "flops_per_token_no_attention": flops_per_token(config),
            "attention_flops_per_key": flops_per_token(config, 1.0)["body"]
            - flops_per_token(config)["body"],
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


def peak_flops(device: str, override_tflops: float | None) -> float | None:
    if override_tflops is not None:
        return override_tflops * 1e12
    for name, flops in PEAK_BF16_FLOPS.items():
        if name in device:
            return flops
    return None


def arm_row(facts: dict[str, Any], peak: float | None, mean_context: float) -> dict[str, Any]:
    """Throughput, memory and MFU of one arm. MFU counts the model FLOPs of the real
    tokens (body at each sample's mean causal context, head on supervised tokens):
    padding and cross-sample attention in a packed row are work, not model FLOPs."""
    s = facts["summary"]
    body = facts["flops_per_token_no_attention"]["body"]
    body += facts["attention_flops_per_key"] * mean_context
    model_flops = (
        body * s["real_tokens"] + facts["flops_per_token_no_attention"]["head"] * s["loss_tokens"]
    )
    achieved = model_flops / s["wall_s"]
    return {
        "real_tokens_per_s": s["real_tokens_per_s"],
        "padded_tokens_per_s": s["padded_tokens_per_s"],
        "samples_per_s": s["emitted_samples_per_s"],
        "padding_efficiency": s["padding_efficiency"],
        "steps": s["optimizer_steps"],
        "wall_s": s["wall_s"],
        "real_tokens": s["real_tokens"],
        "padded_tokens": s["padded_tokens"],
        "loss_tokens": s["loss_tokens"],
        "emitted_samples": s["emitted_samples"],
        "loader_wait_share": s.get("loader_wait_share"),
        "peak_memory_gib": facts["peak_memory_gib"],
        "peak_reserved_gib": facts["peak_reserved_gib"],
        "model_tflops_per_s": achieved / 1e12,
        "mfu": achieved / peak if peak else None,
    }


def run_arms(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out / ("dry_run" if args.dry_run else "arms")
    rows: dict[str, Any] = {}
    arms_facts: dict[str, Any] = {}
    started = time.perf_counter()
    for arm in args.arms.split(","):
        out_dir = out / arm
        command = [sys.executable, "-m", "experiments.gpu.run", CHILD_FLAG]
        command += arm_overrides(arm, args, out_dir)
        arm_started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"arm {arm} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
        arms_facts[arm] = json.loads((out_dir / ARM_FILE).read_text())
        arms_facts[arm]["process_s"] = time.perf_counter() - arm_started
        print(f"{arm}: done in {arms_facts[arm]['process_s']:.0f} s", flush=True)
    first = next(iter(arms_facts.values()))
    device = first["device"]
    peak = peak_flops(device, args.peak_tflops)
    # Mean causal context of the real samples, the same in every arm (same records).
    s = first["summary"]
    mean_length = s["real_tokens"] / s["emitted_samples"]
    for arm, facts in arms_facts.items():
        rows[arm] = arm_row(facts, peak, (mean_length + 1) / 2)
        rows[arm]["process_s"] = facts["process_s"]
    base = rows.get("standard")
    for row in rows.values():
        row["vs_standard"] = row["samples_per_s"] / base["samples_per_s"] if base else None
    return {
        "status": "dry run (CPU, tiny model): checks the code path, not a measurement"
        if args.dry_run
        else "measured",
        "arms": rows,
        "meta": results_meta(
            device=device,
            peak_bf16_flops=peak,
            cuda=first["cuda"],
            wall_s=time.perf_counter() - started,
            overrides=arm_overrides("<arm>", args, out / "<arm>"),
            flops_per_token_no_attention=first["flops_per_token_no_attention"],
            attention_flops_per_key=first["attention_flops_per_key"],
            mean_sample_tokens=mean_length,
            host=platform.node(),
        ),
    }


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['meta']['device']}  ({report['status']})")
    header = f"{'arm':11s} {'tokens/s':>10s} {'samples/s':>10s} {'pad eff':>8s} {'steps':>6s}"
    print(header + f" {'peak GiB':>9s} {'MFU':>6s} {'vs std':>7s}")
    for arm, row in report["arms"].items():
        memory = row["peak_memory_gib"]
        mfu = row["mfu"]
        print(
            f"{arm:11s} {row['real_tokens_per_s']:10.0f} {row['samples_per_s']:10.2f} "
            f"{row['padding_efficiency']:8.3f} {row['steps']:6d} "
            f"{'-' if memory is None else f'{memory:.1f}':>9s} "
            f"{'-' if mfu is None else f'{100 * mfu:.1f}%':>6s} "
            f"{row['vs_standard']:6.2f}x"
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, seconds")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--regime", default="mix", help="ShareGPT whole, first_exchange, mix")
    parser.add_argument("--samples", type=int, default=None, help="records (default 2000)")
    parser.add_argument("--token-budget", type=int, default=None, help="default 16384")
    parser.add_argument("--outstanding-depth", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=None, help="default 4096")
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument(
        "--attn",
        default="sdpa",
        help="attention backend of every arm (flash_attention_2 "
        "where flash-attn is installed: odb_packed then runs varlen instead of a dense mask)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="device bf16 peak")
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    args = parser.parse_args(argv)
    # The dry run keeps the arms and the code path and shrinks the work to seconds.
    small = args.dry_run
    args.samples = args.samples or (48 if small else 2000)
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
    report = run_arms(args)
    print_table(report)
    target = args.out / "dry_run.json" if args.dry_run else HERE / "results.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
