"""Quality at equal supervised tokens: standard vs odb vs odb with token-target steps.

Three arms train the same CPU model (``model=cpu_bench``) from the same seed (same
initialisation, same train/validation split) on the same samples for the same number of
epochs, so every arm sees exactly the same supervised tokens; they differ only in how the
samples are batched and when the optimizer steps:

* ``standard``: fixed batches of 8 (``experiment=sharegpt_standard``), one step per batch;
* ``odb``: online batches under ``token_budget`` (``experiment=sharegpt_odb``), one step
  per batch;
* ``odb_token_target``: the same online batches, the optimizer steps once a step's
  supervised tokens reach ``model.step.tokens_per_step=N``. ``N`` is chosen before training,
  from the data alone: the simulator predicts the odb micro-batches of every epoch (it
  replays the loader exactly) and ``N`` is the value whose token-target steps come
  closest to standard's step count, i.e. whose steps carry on average the supervised
  tokens of standard's steps.

Probes: ``odb_token_target`` again at other ``outstanding_depth`` (``--probes``), the
same samples, tokens, seed and ``N`` with other groups, to see how far the final loss moves
with batch composition alone.

Validation loss (token-weighted, ``val/loss``) after every epoch on the same held-out
records, read from each run's CSV log, plotted against supervised tokens seen and against
optimizer steps; ``results.json`` holds the curves and the final deltas to ``standard``.

    python -m experiments.quality.run [--samples 896] [--val-samples 128] [--epochs 5]
        [--probes 96,160] [--reuse]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path
from typing import Any

from experiments.common import ROOT, read_summary, results_meta, run_train

HERE = Path(__file__).resolve().parent
TOLERANCE = 0.02
ARMS = ("standard", "odb", "odb_token_target")


def common_overrides(args: argparse.Namespace) -> list[str]:
    return [
        "model=cpu_bench",
        "logger=csv",
        f"data.max_samples={args.samples}",
        f"data.val_samples={args.val_samples}",
        f"trainer.max_epochs={args.epochs}",
        f"seed={args.seed}",
    ]


def arm_overrides(arm: str, tokens_per_step: int) -> list[str]:
    if arm == "standard":
        return ["experiment=sharegpt_standard"]
    if arm == "odb":
        return ["experiment=sharegpt_odb"]
    return ["experiment=sharegpt_odb", f"model.step.tokens_per_step={tokens_per_step}"]


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from odb_lightning.app.config_store import prepare_composition

    prepare_composition()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return hydra_compose("train", overrides=overrides)


def plan_arms(args: argparse.Namespace) -> dict[str, Any]:
    """``N`` for the token-target arm, and every arm's optimizer steps, from the data."""
    import hydra

    from experiments.quality.optimizer_steps import (
        choose_tokens_per_step,
        predict_batches,
        step_statistics,
        token_target_steps,
    )

    # The length cache (a Hydra-runtime path) is for length-pass modes; odb does not use it.
    cfg = compose([*common_overrides(args), *arm_overrides("odb", 0), "data.length_cache_dir=null"])
    batching = hydra.utils.instantiate(cfg.batching)
    datamodule = hydra.utils.instantiate(cfg.data, _partial_=True)(
        tokenizer=hydra.utils.instantiate(cfg.tokenizer), batching=batching
    )
    datamodule.setup("fit")
    batches = predict_batches(cfg, datamodule, batching, args.epochs)
    tokens_per_step = choose_tokens_per_step(batches)
    arm_steps = {
        "standard": (batches.standard, False),
        "odb": (batches.odb, True),
        "odb_token_target": (token_target_steps(batches, tokens_per_step), True),
    }
    return {
        "tokens_per_step": tokens_per_step,
        "train_samples": len(datamodule.train_indices),
        "predicted_steps": {
            arm: step_statistics(batches, steps, by_samples, cfg.model)
            for arm, (steps, by_samples) in arm_steps.items()
        },
    }


def run_arm(overrides: list[str], out_dir: Path, reuse: bool) -> dict[str, Any]:
    """One training run (or, with ``reuse``, the finished run already in ``out_dir``)."""
    started = time.perf_counter()
    if reuse and (out_dir / "summary.json").exists():
        summary = read_summary(out_dir)
    else:
        summary = run_train(out_dir, overrides)  # a fresh run, not a second CSV version
    return {
        "summary": summary,
        "curve": val_curve(out_dir),
        "process_s": time.perf_counter() - started,
    }


def val_curve(out_dir: Path) -> list[dict[str, float]]:
    """``(epoch, optimizer step, val/loss)`` of every validation in the run's CSV log."""
    (path,) = (out_dir / "csv").glob("version_*/metrics.csv")
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("val/loss")]
    return [
        {"epoch": int(r["epoch"]), "step": int(r["step"]), "val_loss": float(r["val/loss"])}
        for r in rows
    ]


def run_probes(args: argparse.Namespace, tokens_per_step: int, reference: dict) -> list[dict]:
    """``odb_token_target`` again at other ``outstanding_depth``: the same samples, tokens,
    seed and ``N``, other groups. How far the final loss moves with batch composition
    alone is the yardstick for the arms' deltas."""
    probes = []
    for depth in args.probes:
        arm = f"odb_token_target_d{depth}"
        overrides = [
            *common_overrides(args),
            *arm_overrides("odb_token_target", tokens_per_step),
            f"batching.policy.outstanding_depth={depth}",
        ]
        run = run_arm(overrides, args.out / arm, args.reuse)
        final = run["curve"][-1]["val_loss"]
        probes.append(
            {
                "outstanding_depth": depth,
                "final_val_loss": final,
                "minus_odb_token_target": final - reference["curve"][-1]["val_loss"],
                "optimizer_steps": run["summary"]["optimizer_steps"],
                "supervised_tokens": run["summary"]["loss_tokens"],
                "curve": run["curve"],
            }
        )
        print(arm, json.dumps(probes[-1]["curve"][-1]), flush=True)
    return probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=896, help="records read (incl. val)")
    parser.add_argument("--val-samples", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    parser.add_argument(
        "--probes",
        type=lambda text: [int(v) for v in text.split(",") if v],
        default=[96, 160],
        help="outstanding_depth values of the batch-composition probes",
    )
    parser.add_argument("--reuse", action="store_true", help="read runs already in --out")
    args = parser.parse_args()
    choice = plan_arms(args)
    print(json.dumps(choice), flush=True)
    arms = {}
    for arm in ARMS:
        overrides = [*common_overrides(args), *arm_overrides(arm, choice["tokens_per_step"])]
        arms[arm] = run_arm(overrides, args.out / arm, args.reuse) | {"overrides": overrides}
        print(
            arm, json.dumps(arms[arm]["curve"][-1]), f"{arms[arm]['process_s']:.0f} s", flush=True
        )
    probes = run_probes(args, choice["tokens_per_step"], arms["odb_token_target"])
    tokens = {arm: a["summary"]["loss_tokens"] for arm, a in arms.items()}
    tokens |= {f"probe_d{p['outstanding_depth']}": p["supervised_tokens"] for p in probes}
    if len(set(tokens.values())) != 1:
        raise RuntimeError(f"arms saw different supervised tokens: {tokens}")
    per_epoch = tokens["standard"] / args.epochs
    for a in [*arms.values(), *probes]:
        for point in a["curve"]:
            point["supervised_tokens_seen"] = per_epoch * (point["epoch"] + 1)
    final = {arm: a["curve"][-1]["val_loss"] for arm, a in arms.items()}
    deltas = {arm: final[arm] - final["standard"] for arm in ARMS[1:]}
    report = {
        "token_target_choice": choice,
        "final_val_loss": final,
        "delta_vs_standard": deltas,
        "within_tolerance": {arm: abs(d) <= TOLERANCE for arm, d in deltas.items()},
        "tolerance": TOLERANCE,
        "batch_composition_probes": probes,
        "arms": {
            arm: {
                "curve": a["curve"],
                "optimizer_steps": a["summary"]["optimizer_steps"],
                "micro_batches": a["summary"]["steps_per_rank"],
                "supervised_tokens": a["summary"]["loss_tokens"],
                "supervised_tokens_per_optimizer_step": a["summary"]["loss_tokens"]
                / a["summary"]["optimizer_steps"],
                "padding_efficiency": a["summary"]["padding_efficiency"],
                "train_wall_s": a["summary"]["wall_s"],
                "emitted_samples_per_s": a["summary"]["emitted_samples_per_s"],
                "overrides": a["overrides"],
            }
            for arm, a in arms.items()
        },
        "meta": results_meta(load_average_after=list(os.getloadavg())),
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report)
    print(json.dumps({k: report[k] for k in ("final_val_loss", "delta_vs_standard")}, indent=2))


def plot(report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, data in report["arms"].items():
        curve = data["curve"]
        label = f"{arm} ({data['optimizer_steps']} steps)"
        axes[0].plot(
            [p["supervised_tokens_seen"] for p in curve],
            [p["val_loss"] for p in curve],
            marker="o",
            label=label,
        )
        axes[1].plot(
            [p["step"] for p in curve], [p["val_loss"] for p in curve], marker="o", label=label
        )
    for probe in report["batch_composition_probes"]:
        curve = probe["curve"]
        style = {"linestyle": "--", "linewidth": 1, "color": "grey"}
        label = f"odb_token_target, D={probe['outstanding_depth']} (probe)"
        tokens = [p["supervised_tokens_seen"] for p in curve]
        axes[0].plot(tokens, [p["val_loss"] for p in curve], label=label, **style)
        axes[1].plot([p["step"] for p in curve], [p["val_loss"] for p in curve], **style)
    axes[0].set_xlabel("supervised tokens seen")
    axes[1].set_xlabel("optimizer steps")
    for axis in axes:
        axis.set_ylabel("validation loss (token-weighted)")
        axis.legend(fontsize=8)
    figure.suptitle("model=cpu_bench, ShareGPT first exchanges, same seed and tokens")
    figure.tight_layout()
    figure.savefig(HERE / "val_loss.png", dpi=120)


if __name__ == "__main__":
    main()
