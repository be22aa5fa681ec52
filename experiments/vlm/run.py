"""Image-text batching: the length profile of each VLM set, a modes table on those lengths
(steps, padding efficiency, patch fill), and CPU training throughput against standard.

Part 1 writes the LLaVA- and ShareGPT4o-shaped sets, runs every record through the real
worker-side pipeline (image files read, Qwen2-VL processor, placeholder expansion) and
records each sample's LLM length and ViT patches. Part 2 plans one epoch per mode on
those lengths with the planners and the multi-rank simulator the runtime shares (odb
also at 1, 8 and 64 ranks on 256 samples per rank drawn from the measured ones) and
scores every step's patches against ``max_patches``; the window's grouping under the
patch budget (``core/grouping.py``) is shown on each ODB-sized window of the epoch order,
one rank. Part 3 trains ``experiment=<set>_odb`` and ``<set>_standard`` on CPU with the tiny
Qwen2-VL (token ids folded) and reads emitted samples/s from each run's summary.json.

    python -m experiments.vlm.run [--samples 1000] [--train-samples 96] [--repeats 3]
        [--skip-train | --only-train] [--lock FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from experiments.common import bench_lock, command_line, results_meta, run_train
from odb_lightning.core.budget import Budget
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.grouping import group_window
from odb_lightning.core.order import epoch_permutation
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.simulate import simulate
from odb_lightning.core.types import SampleInfo
from odb_lightning.data import QwenTokenizer
from odb_lightning.data.sources.llava import build_llava_set, llava_records
from odb_lightning.data.sources.sharegpt4o import build_sharegpt4o_set
from odb_lightning.data.vision import ImageSettings
from odb_lightning.data.vision_dataset import VisionChatDataset
from odb_lightning.sample import count_image_patches, count_image_tokens, count_patch_squares

HERE = Path(__file__).resolve().parent
SETS = {"llava": build_llava_set, "sharegpt4o": build_sharegpt4o_set}
IMAGES = ImageSettings()  # Qwen2-VL's own processor defaults (max_pixels 28 * 28 * 1280)
MAX_SEQ_LEN = 4096
PER_RANK = 256


def measure_set(name: str, num_samples: int, out_dir: Path) -> dict[str, list[int]]:
    """Every sample's LLM length, image tokens and patches, through the real pipeline."""
    path = SETS[name](out_dir, num_samples, seed=0)
    records = llava_records(path).records
    dataset = VisionChatDataset(records, QwenTokenizer(), MAX_SEQ_LEN, IMAGES, image_root=out_dir)
    lengths, image_tokens, patches, patch_squares = [], [], [], []
    for index in range(len(dataset)):
        sample = dataset[index]
        lengths.append(int(sample["input_ids"].numel()))
        image_tokens.append(count_image_tokens(sample))
        patches.append(count_image_patches(sample))
        patch_squares.append(count_patch_squares(sample))
    return {
        "lengths": lengths,
        "image_tokens": image_tokens,
        "patches": patches,
        "patch_squares": patch_squares,
    }


def profile(values: list[int]) -> dict[str, float]:
    mean = statistics.fmean(values)
    return {
        "mean": round(mean, 1),
        "cv": round(statistics.pstdev(values) / mean, 3),
        "max": max(values),
    }


def score(batches: list[list[int]], measured: dict[str, list], budget: BatchingConfig) -> dict:
    """Steps, padding efficiency, budget fill and patch fill of a plan (one rank)."""
    lengths, patches = measured["lengths"], measured["patches"]
    steps = [b for b in batches if b]
    real = sum(lengths[i] for b in steps for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in steps)
    step_patches = [sum(patches[i] for i in b) for b in steps]
    max_patches = budget.rows.max_patches
    return {
        "steps": len(steps),
        "padding_efficiency": round(real / padded, 3),
        "budget_fill": round(padded / len(steps) / budget.token_budget, 3),
        "patch_fill": round(statistics.fmean(step_patches) / max_patches, 3),
        "max_step_patches": max(step_patches),
        "steps_over_patch_budget": sum(
            1 for b, p in zip(steps, step_patches, strict=True) if len(b) > 1 and p > max_patches
        ),
    }


def window_patch_groups(measured: dict[str, list], config: BatchingConfig) -> list[list[int]]:
    """The window's grouping under the patch budget on each ``outstanding_depth`` window of
    the epoch order (one rank, no carry-over between windows)."""
    order = epoch_permutation(len(measured["lengths"]), config.seed, 0)
    depth, groups = config.policy.outstanding_depth, []
    for start in range(0, len(order), depth):
        window = [
            SampleInfo(
                i,
                measured["lengths"][i],
                position=k,
                num_patches=measured["patches"][i],
                patch_square_sum=measured["patch_squares"][i],
            )
            for k, i in enumerate(order[start : start + depth])
        ]
        cut = group_window(window, Budget(config.token_budget), patch_budget=config.patch_budget)
        groups += [[s.sample_id for s in g.samples] for g in cut]
    return groups


def modes_table(measured: dict[str, list], token_budget: int, max_patches: int) -> list[dict]:
    base = BatchingConfig.of(
        token_budget=token_budget, outstanding_depth=256, max_patches=max_patches, batch_size=8
    )
    lengths = measured["lengths"]
    rows = []
    for mode in ("standard", "sorted", "oracle", "odb"):
        batches = plan_epoch(lengths, base, mode=mode)
        rows.append({"mode": mode, "ranks": 1, **score(batches, measured, base)})
    for world in (1, 8, 64):
        # PER_RANK samples per rank, drawn (seeded, with replacement) from the measured
        # samples: the set itself is too small to fill 64 shards.
        rng = random.Random(world)
        drawn = [rng.randrange(len(lengths)) for _ in range(world * PER_RANK)]
        shards = [drawn[r::world] for r in range(world)]
        steps = simulate([[lengths[i] for i in s] for s in shards], base)
        batches = [
            [s[p] for p in step] for s, rank in zip(shards, steps, strict=True) for step in rank
        ]
        row = score(batches, measured, base)
        row["steps"] = len(steps[0])  # per rank (equal on every rank)
        rows.append({"mode": f"odb ({PER_RANK} drawn samples per rank)", "ranks": world, **row})
    patch_groups = window_patch_groups(measured, base)
    rows.append(
        {"mode": "odb windows + max_patches", "ranks": 1, **score(patch_groups, measured, base)}
    )
    return rows


def throughput(name: str, samples: int, out_dir: Path, repeats: int, lock: Path | None) -> dict:
    """Emitted samples/s of ``<name>_odb`` and ``<name>_standard`` on CPU, one process,
    the arms interleaved ``repeats`` times: medians, and the median per-repeat ratio."""
    overrides = [
        f"experiment={name}_odb",
        "logger=csv",
        f"data.sizes.max_samples={samples}",
        "data.sizes.val_samples=0",
        f"data.caches.image_set_dir={out_dir}",
        "model.architecture.token_id_fold=4096",
        "trainer.max_epochs=1",
        "batching.loader.num_workers=1",
    ]
    keys = (
        "emitted_samples",
        "emitted_samples_per_s",
        "padding_efficiency",
        "optimizer_steps",
        "image_tokens",
        "image_patches",
        "padded_tokens",
        "real_tokens",
    )
    runs: dict[str, list[dict]] = {"odb": [], "standard": []}
    for _ in range(repeats):
        for mode in runs:
            arm = [o.replace(f"{name}_odb", f"{name}_{mode}") for o in overrides]
            with bench_lock(lock):
                summary = run_train(out_dir / f"train_{name}_{mode}", arm)
            runs[mode].append({k: summary.get(k) for k in keys})
    rates = {m: [r["emitted_samples_per_s"] for r in rs] for m, rs in runs.items()}
    ratios = [o / s for o, s in zip(rates["odb"], rates["standard"], strict=True)]
    return {
        "runs": runs,
        "median_samples_per_s": {m: round(statistics.median(r), 3) for m, r in rates.items()},
        "speedup_per_repeat": [round(r, 2) for r in ratios],
        "speedup": round(statistics.median(ratios), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="records per set (parts 1-2)")
    parser.add_argument("--train-samples", type=int, default=96)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--max-patches", type=int, default=32768)
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lock", type=Path, default=None, help="bench lock file (flock)")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument(
        "--only-train", action="store_true", help="keep results.json's sets, time again"
    )
    args = parser.parse_args()
    results: dict[str, Any] = {"meta": results_meta(images=IMAGES.__repr__()), "sets": {}}
    if args.only_train:
        results = json.loads((HERE / "results.json").read_text())
        results["meta"]["throughput_command"] = command_line()
        for name in SETS:
            results["sets"][name]["throughput"] = throughput(
                name, args.train_samples, args.out, args.repeats, args.lock
            )
        (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        return
    for name in SETS:
        measured = measure_set(name, args.samples, args.out)
        text = [n - t for n, t in zip(measured["lengths"], measured["image_tokens"], strict=True)]
        with_image = sum(1 for p in measured["patches"] if p)
        results["sets"][name] = {
            "samples": len(measured["lengths"]),
            "with_image": with_image,
            "length": profile(measured["lengths"]),
            "text_tokens": profile(text),
            "image_tokens_per_image_sample": profile([t for t in measured["image_tokens"] if t]),
            "modes": modes_table(measured, args.token_budget, args.max_patches),
        }
        if not args.skip_train:
            results["sets"][name]["throughput"] = throughput(
                name, args.train_samples, args.out, args.repeats, args.lock
            )
        print(json.dumps(results["sets"][name], indent=1))
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
