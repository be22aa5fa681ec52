"""Quality at equal supervised tokens: how batching changes the validation loss.

Every arm trains the same CPU model (``model=cpu_bench``) on the same samples for the same
number of epochs, so every arm sees exactly the same supervised tokens; arms differ only in
how the samples are batched and when the optimizer steps. Each seed (``--seeds``) draws a
new initialisation, train/validation split and sample order; within a seed every arm has
the same ones, so the deltas to ``standard`` are paired.

* ``standard``: fixed batches of 8 in a random order (``experiment=sharegpt_standard``);
* ``standard_matched``: ``standard`` with the batch size whose step count comes closest to
  ``odb``'s (more, smaller steps), to separate the step count from the batching;
* ``sorted``: batches of 8 cut from the length-sorted data, their order shuffled each epoch
  (``experiment=sharegpt_sorted``): the paper's regression case;
* ``odb``: online batches under the token budget (``experiment=sharegpt_odb``), one
  optimizer step per batch;
* ``odb_token_target``: the same online batches, the optimizer steps once a step's
  supervised tokens reach ``model.step.tokens_per_step=N``;
* ``odb_token_target_paired``: the same with ``batching.policy.emission_order=paired``
  (the costliest step of a round next to its cheapest);
* ``odb_token_target_small``: paired, under half the token budget: more, smaller groups
  per optimizer step;
* ``odb_token_target_default``: ``experiment=sharegpt_odb`` and ``tokens_per_step=N``
  only, so the run's own resolution (``lit.model.token_target.batching_for_steps``)
  picks the token budget and the emission order.

The three arms before it name their budget and emission order on the command line, which
the run keeps, so they measure the batching they are named for.

``N`` is chosen per arm and seed before training, from the data alone: the simulator
predicts the odb micro-batches of every epoch (it replays the loader exactly) and ``N`` is
the value whose token-target steps come closest to standard's step count, i.e. whose
steps carry on average the supervised tokens of standard's steps. For
``odb_token_target_default`` the budget depends on ``N``, so ``N`` is chosen again on the
batches of the budget the last ``N`` resolves to, until the budget stays the same.

A rerun of some arms keeps the other arms of the earlier ``results.json`` under
``earlier``, with the earlier ``standard`` their deltas were taken against and the
earlier pass's ``meta``.

Validation loss (token-weighted, ``val/loss``) after every epoch on the seed's held-out
records, read from each run's CSV log; ``results.json`` holds the curves, each arm's final
loss per seed, their mean and spread, and the paired deltas to ``standard``.

    python -m experiments.quality.run [--seeds 0,1,2] [--arms ...] [--samples 896]
        [--val-samples 128] [--epochs 5] [--reuse]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from experiments.common import ROOT, read_summary, results_meta, run_train

HERE = Path(__file__).resolve().parent
TOLERANCE = 0.02
ARMS = (
    "standard",
    "standard_matched",
    "sorted",
    "odb",
    "odb_token_target",
    "odb_token_target_paired",
    "odb_token_target_small",
    "odb_token_target_default",
)
ODB_BUDGET = 4096
"""``experiment=sharegpt_odb``'s token budget (the small arm runs at half of it)."""


def common_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    return [
        "model=cpu_bench",
        "logger=csv",
        f"data.sizes.max_samples={args.samples}",
        f"data.sizes.val_samples={args.val_samples}",
        f"trainer.max_epochs={args.epochs}",
        f"seed={seed}",
    ]


def batching_overrides(arm: str, matched_batch_size: int = 8) -> list[str]:
    """The arm's experiment and batching, without its ``tokens_per_step``."""
    if arm == "standard":
        return ["experiment=sharegpt_standard"]
    if arm == "standard_matched":
        return ["experiment=sharegpt_standard", f"batching.policy.batch_size={matched_batch_size}"]
    if arm == "sorted":
        return ["experiment=sharegpt_sorted", "batching.policy.batch_size=8"]
    overrides = ["experiment=sharegpt_odb"]
    if arm == "odb_token_target":  # named, so token-target steps keep them
        overrides += [
            f"batching.token_budget={ODB_BUDGET}",
            "batching.policy.emission_order=shuffled",
        ]
    if arm == "odb_token_target_paired":
        overrides.append(f"batching.token_budget={ODB_BUDGET}")
    if arm in ("odb_token_target_paired", "odb_token_target_small"):
        overrides.append("batching.policy.emission_order=paired")
    if arm == "odb_token_target_small":
        overrides.append(f"batching.token_budget={ODB_BUDGET // 2}")
    return overrides


MAX_BUDGET_ROUNDS = 8
"""Most times ``odb_token_target_default`` chooses ``N`` again on the budget it resolves."""


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from odb_lightning.app.config_store import prepare_composition

    prepare_composition()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return hydra_compose("train", overrides=overrides)


def plan_seed(args: argparse.Namespace, seed: int, arms: list[str]) -> dict[str, Any]:
    """Every arm's overrides and predicted optimizer steps for one seed, from the data:
    ``N`` for the token-target arms, the batch size of ``standard_matched``."""
    import hydra

    from experiments.quality.optimizer_steps import (
        EpochBatches,
        choose_tokens_per_step,
        predict_batches,
        step_statistics,
        token_target_steps,
    )
    from odb_lightning.app.components import with_model_cost
    from odb_lightning.core.budget import BUDGET_QUANTUM
    from odb_lightning.lit.model.token_target import STEP_BATCHING_KEYS, batching_for_steps

    def arm_batching(arm: str, tokens_per_step: int | None = None) -> tuple[Any, Any]:
        """The arm's config and the batching its run builds: rows cost the model's FLOPs,
        and token-target steps resolve what the arm's command line does not name."""
        # The caches' default paths are Hydra-runtime paths, unset outside train.py.
        caches = [f"data.caches.{c}_dir=null" for c in ("record", "stream")]
        caches.append(f"data.caches.length_dir={args.out / 'length_cache'}")
        cfg = compose([*common_overrides(args, seed), *batching_overrides(arm), *caches])
        architecture = hydra.utils.instantiate(cfg.model.architecture)
        batching = with_model_cost(hydra.utils.instantiate(cfg.batching), architecture)
        named = {o.split("=", 1)[0] for o in batching_overrides(arm)} & set(STEP_BATCHING_KEYS)
        return cfg, batching_for_steps(batching, tokens_per_step, named).batching

    def predicted(arm: str, batch_size: int = 8, tokens_per_step: int | None = None):
        cfg, batching = arm_batching(arm, tokens_per_step)
        datamodule = hydra.utils.instantiate(cfg.data, _partial_=True)(
            tokenizer=hydra.utils.instantiate(cfg.tokenizer), batching=batching
        )
        datamodule.setup("fit")
        fixed = "sorted" if arm == "sorted" else "standard"
        batches = predict_batches(
            cfg, datamodule, batching, args.epochs, fixed_mode=fixed, batch_size=batch_size
        )
        return cfg, batches, batching

    def chosen_tokens_per_step(arm: str) -> tuple[int, EpochBatches]:
        """``N`` for the arm and the batches it runs on. For the default arm the budget
        follows ``N`` (``group_budget_cap``): ``N`` is chosen again on the batches of the
        budget the last ``N`` resolves to, until a budget repeats; then, among the budgets
        visited, the ``N`` that resolves to its budget and comes closest to standard's step
        count on that budget's batches is taken (the choice can cycle between two)."""
        _, batches, batching = predicted(arm)
        n = choose_tokens_per_step(batches)
        if arm != "odb_token_target_default":
            return n, batches
        visited: dict[int, EpochBatches] = {}
        for _ in range(MAX_BUDGET_ROUNDS):
            _, batches, batching = predicted(arm, tokens_per_step=n)
            if batching.token_budget in visited:
                break
            visited[batching.token_budget] = batches
            n = choose_tokens_per_step(batches)
        else:
            raise RuntimeError(f"seed {seed}: the default arm's budget did not settle: {visited}")
        options = [
            (choose_tokens_per_step(b, range(budget, budget + BUDGET_QUANTUM, 16)), b)
            for budget, b in visited.items()
        ]
        target = sum(len(epoch) for epoch in batches.standard)

        def gap(option: tuple[int, EpochBatches]) -> tuple[int, int]:
            n, b = option
            return abs(sum(map(len, token_target_steps(b, n))) - target), n

        return min(options, key=gap)

    cfg, odb, _ = predicted("odb")
    odb_steps = sum(map(len, odb.odb))
    per_epoch = odb_steps / args.epochs
    train = len(odb.lengths)
    # The batch size whose standard steps come closest to odb's.
    matched = min(range(1, 9), key=lambda b: (abs(args.epochs * -(-train // b) - odb_steps), b))
    plan: dict[str, Any] = {"train_samples": train, "odb_steps_per_epoch": per_epoch}
    for arm in arms:
        overrides = batching_overrides(arm, matched)
        if arm.startswith("standard") or arm == "sorted":
            size = matched if arm == "standard_matched" else 8
            batches = odb if arm == "standard" else predicted(arm, size)[1]
            steps, by_samples, n = batches.standard, False, None
        else:
            if arm == "odb":
                batches = predicted(arm)[1]
                steps, by_samples, n = batches.odb, True, None
            else:
                n, batches = chosen_tokens_per_step(arm)
                steps, by_samples = token_target_steps(batches, n), True
                overrides = [*overrides, f"model.step.tokens_per_step={n}"]
        plan[arm] = {
            "overrides": [*common_overrides(args, seed), *overrides],
            "tokens_per_step": n,
            "predicted": step_statistics(batches, steps, by_samples, cfg.model),
        }
        if arm.startswith("odb"):  # the budget and order the run resolves
            batching = arm_batching(arm, n)[1]
            plan[arm]["token_budget"] = batching.token_budget
            plan[arm]["emission_order"] = batching.policy.emission_order.value
    return plan


def seed_plan(args: argparse.Namespace, seed: int, arms: list[str]) -> dict[str, Any]:
    """:func:`plan_seed`, kept in ``<out>/seed<N>/plan.json``; with ``--reuse`` a kept plan
    of these settings that covers ``arms`` is read instead of planned again."""
    path = args.out / f"seed{seed}" / "plan.json"
    settings = {k: getattr(args, k) for k in ("samples", "val_samples", "epochs")}
    if args.reuse and path.exists():
        kept = json.loads(path.read_text())
        if kept["settings"] == settings and set(arms) <= set(kept["plan"]):
            return kept["plan"]
    plan = plan_seed(args, seed, arms)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "plan": plan}, indent=2) + "\n")
    return plan


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


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def summarize(runs: dict[int, dict[str, dict]], plans: dict[int, dict], arms: list[str]) -> dict:
    """Per arm: each seed's final loss and paired delta, their mean and spread."""
    table = {}
    for arm in arms:
        rows = []
        for seed, seed_runs in runs.items():
            run, plan = seed_runs[arm], plans[seed][arm]
            summary = run["summary"]
            final = run["curve"][-1]["val_loss"]
            rows.append(
                {
                    "seed": seed,
                    "final_val_loss": final,
                    "delta_vs_standard": final - seed_runs["standard"]["curve"][-1]["val_loss"],
                    "optimizer_steps": summary["optimizer_steps"],
                    "predicted_optimizer_steps": plan["predicted"]["optimizer_steps"],
                    "step_length_cv": summary.get("step_length_cv"),
                    "lr_factor_sum": plan["predicted"]["lr_factor_sum"],
                    "tokens_per_step": plan["tokens_per_step"],
                    "supervised_tokens": summary["loss_tokens"],
                    "supervised_tokens_per_optimizer_step": summary["loss_tokens"]
                    / summary["optimizer_steps"],
                    "padding_efficiency": summary["padding_efficiency"],
                    "train_wall_s": summary["wall_s"],
                    "overrides": plan["overrides"],
                    "curve": run["curve"],
                }
            )
        deltas = [r["delta_vs_standard"] for r in rows]
        table[arm] = {
            "final_val_loss": spread([r["final_val_loss"] for r in rows]),
            "delta_vs_standard": spread(deltas),
            "within_tolerance": abs(statistics.fmean(deltas)) <= TOLERANCE,
            "optimizer_steps": spread([r["optimizer_steps"] for r in rows]),
            "step_length_cv": spread([r["step_length_cv"] for r in rows if r["step_length_cv"]]),
            "lr_factor_sum": spread([r["lr_factor_sum"] for r in rows]),
            "per_seed": rows,
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=896, help="records read (incl. val)")
    parser.add_argument("--val-samples", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=lambda t: [int(v) for v in t.split(",")], default=[0, 1, 2])
    parser.add_argument(
        "--arms", type=lambda t: t.split(","), default=list(ARMS), help="comma-separated"
    )
    parser.add_argument("--out", type=Path, default=HERE / "runs")
    parser.add_argument("--reuse", action="store_true", help="read runs already in --out")
    args = parser.parse_args()
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown or "standard" not in args.arms:
        parser.error(f"--arms: unknown {unknown}; 'standard' is required; arms: {list(ARMS)}")
    arms = [arm for arm in ARMS if arm in args.arms]
    plans, runs = {}, {}
    for seed in args.seeds:
        plans[seed] = seed_plan(args, seed, arms)
        runs[seed] = {}
        for arm in arms:
            run = run_arm(plans[seed][arm]["overrides"], args.out / f"seed{seed}" / arm, args.reuse)
            runs[seed][arm] = run
            print(
                f"seed {seed} {arm}: val {run['curve'][-1]['val_loss']:.4f}, "
                f"{run['summary']['optimizer_steps']} steps, "
                f"step_length_cv {run['summary'].get('step_length_cv')}, "
                f"{run['process_s']:.0f} s",
                flush=True,
            )
    tokens = {(s, a): r["summary"]["loss_tokens"] for s in runs for a, r in runs[s].items()}
    for seed in runs:
        if len({tokens[(seed, arm)] for arm in arms}) != 1:
            raise RuntimeError(f"seed {seed}: arms saw different supervised tokens: {tokens}")
        per_epoch = tokens[(seed, "standard")] / args.epochs
        for run in runs[seed].values():
            for point in run["curve"]:
                point["supervised_tokens_seen"] = per_epoch * (point["epoch"] + 1)
    report = {
        "seeds": args.seeds,
        "tolerance": TOLERANCE,
        "plans": {
            seed: {k: v for k, v in plan.items() if k not in arms} for seed, plan in plans.items()
        },
        "arms": summarize(runs, plans, arms),
        "meta": results_meta(load_average_after=list(os.getloadavg())),
    }
    results = HERE / "results.json"
    if results.exists():
        earlier = earlier_pass(json.loads(results.read_text()), arms)
        if earlier is not None:
            report["earlier"] = earlier
    results.write_text(json.dumps(report, indent=2) + "\n")
    plot(report)
    print(
        json.dumps(
            {
                arm: {
                    "final": round(a["final_val_loss"]["mean"], 4),
                    "delta": round(a["delta_vs_standard"]["mean"], 4),
                    "delta_std": round(a["delta_vs_standard"]["std"], 4),
                }
                for arm, a in report["arms"].items()
            },
            indent=2,
        )
    )


def earlier_pass(previous: dict[str, Any], arms: list[str]) -> dict[str, Any] | None:
    """The arms of the ``previous`` results that this pass did not rerun, with the
    ``standard`` their deltas were taken against and that pass's seeds, plans and meta
    (``None`` if this pass reran them all). An ``earlier`` pass inside ``previous`` is
    kept the same way."""
    kept = {arm: data for arm, data in previous["arms"].items() if arm not in arms}
    earlier = previous.get("earlier")
    if not kept:
        return None if earlier is None else earlier_pass(earlier, arms)
    kept = {"standard": previous["arms"]["standard"], **kept}
    result = {k: previous[k] for k in ("seeds", "plans", "meta")}
    result["arms"] = kept
    if earlier is not None:
        older = earlier_pass(earlier, [*arms, *kept])
        if older is not None:
            result["earlier"] = older
    return result


def plot(report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    passes = [("", report["arms"])]
    earlier = report.get("earlier")
    if earlier is not None:  # the arms not rerun, at their pass's commit
        commit = (earlier["meta"].get("git_commit") or "earlier")[:7]
        passes.append((f" @{commit}", earlier["arms"]))
    arms = [(f"{arm}{suffix}", data) for suffix, group in passes for arm, data in group.items()]
    for arm, data in arms:
        curves = [row["curve"] for row in data["per_seed"]]
        tokens = [p["supervised_tokens_seen"] for p in curves[0]]
        mean = [statistics.fmean(c[k]["val_loss"] for c in curves) for k in range(len(tokens))]
        low = [min(c[k]["val_loss"] for c in curves) for k in range(len(tokens))]
        high = [max(c[k]["val_loss"] for c in curves) for k in range(len(tokens))]
        steps = data["optimizer_steps"]["mean"]
        (line,) = axes[0].plot(tokens, mean, marker="o", label=f"{arm} ({steps:.0f} steps)")
        axes[0].fill_between(tokens, low, high, color=line.get_color(), alpha=0.15)
        deltas = [row["delta_vs_standard"] for row in data["per_seed"]]
        axes[1].scatter([arm] * len(deltas), deltas, color=line.get_color())
    axes[0].set_xlabel("supervised tokens seen")
    axes[0].set_ylabel("validation loss (token-weighted), mean and range over seeds")
    axes[0].legend(fontsize=7)
    axes[1].axhspan(-TOLERANCE, TOLERANCE, color="grey", alpha=0.2)
    axes[1].set_ylabel("final val loss - standard's (same seed)")
    axes[1].tick_params(axis="x", rotation=30, labelsize=7)
    figure.suptitle(f"model=cpu_bench, ShareGPT first exchanges, seeds {report['seeds']}")
    figure.tight_layout()
    figure.savefig(HERE / "val_loss.png", dpi=120)


if __name__ == "__main__":
    main()
