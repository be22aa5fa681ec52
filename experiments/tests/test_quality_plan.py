"""The quality study's plan: every arm's optimizer steps predicted from the data before
training, the matched batch size and each token-target N chosen as documented."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from experiments.quality.run import ARMS, plan_seed
from odb_lightning.lit.model.token_target import group_budget_cap


def test_every_arm_is_planned_from_the_data(tmp_path: Path) -> None:
    args = argparse.Namespace(samples=160, val_samples=32, epochs=2, out=tmp_path)
    plan = plan_seed(args, 0, list(ARMS))
    train = plan["train_samples"]
    predicted = {arm: plan[arm]["predicted"]["optimizer_steps"] for arm in ARMS}
    assert predicted["standard"] == predicted["sorted"] == 2 * math.ceil(train / 8)
    assert predicted["odb"] == 2 * plan["odb_steps_per_epoch"]
    # The matched batch size is the one whose standard steps come closest to odb's.
    size = int(next(o for o in plan["standard_matched"]["overrides"] if "batch_size" in o)[-1])
    gaps = {b: abs(2 * math.ceil(train / b) - predicted["odb"]) for b in range(1, 9)}
    assert gaps[size] == min(gaps.values())
    assert predicted["standard_matched"] == 2 * math.ceil(train / size)
    token_target = [arm for arm in ARMS if arm.startswith("odb_token_target")]
    for arm in token_target:
        n = plan[arm]["tokens_per_step"]
        assert f"model.step.tokens_per_step={n}" in plan[arm]["overrides"]
        # N brings the token-target steps near standard's count.
        assert abs(predicted[arm] - predicted["standard"]) <= 0.1 * predicted["standard"]
    assert "batching.policy.emission_order=paired" in plan["odb_token_target_paired"]["overrides"]
    assert "batching.token_budget=2048" in plan["odb_token_target_small"]["overrides"]
    # The older token-target arms name their batching, so the run keeps it.
    assert plan["odb_token_target"]["token_budget"] == 4096
    assert plan["odb_token_target"]["emission_order"] == "shuffled"
    # The default arm names only N: the run lowers the budget to at most N and pairs.
    default = plan["odb_token_target_default"]
    assert not any(o.startswith("batching.") for o in default["overrides"])
    assert default["token_budget"] == group_budget_cap(default["tokens_per_step"])
    assert default["token_budget"] < 4096 and default["emission_order"] == "paired"
    # Paired emission and smaller groups mix lengths inside a token-target step.
    spread = {arm: plan[arm]["predicted"]["length_cv_within_step_mean"] for arm in ARMS}
    assert spread["odb_token_target_small"] > spread["odb_token_target"]
    assert spread["odb_token_target_default"] > spread["odb_token_target"]
    assert spread["standard"] > spread["sorted"]


def test_a_rerun_keeps_the_other_arms_with_the_standard_of_their_pass() -> None:
    from experiments.quality.run import earlier_pass

    def arm(loss: float) -> dict:
        return {"final_val_loss": {"mean": loss}}

    previous = {
        "seeds": [0],
        "plans": {},
        "meta": {"git_commit": "old"},
        "arms": {"standard": arm(5.8), "odb": arm(5.81), "sorted": arm(5.84)},
    }
    kept = earlier_pass(previous, ["standard", "odb"])
    assert kept is not None and kept["meta"] == {"git_commit": "old"}
    assert kept["arms"] == {"standard": arm(5.8), "sorted": arm(5.84)}
    # A second rerun keeps the first pass's arms it did not rerun, not the rerun ones.
    current = {**previous, "meta": {"git_commit": "new"}, "earlier": kept}
    current["arms"] = {"standard": arm(5.9), "odb": arm(5.91)}
    again = earlier_pass(current, ["standard", "odb"])
    assert again == kept
    assert earlier_pass(previous, ["standard", "odb", "sorted"]) is None
