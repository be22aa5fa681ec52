"""Token-target steps build each optimizer step from several ODB groups of different
lengths by default: the run lowers a token budget above ``tokens_per_step`` and pairs the
emission order, keeps what the command line names (warning where a kept budget makes
steps of about one group), and logs what it resolved."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from helpers.configs import ComposeConfig
from odb_lightning.app.components import build_data
from odb_lightning.app.run_config import RUN_CONFIG_KEY, saved_override_keys
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.online_policy import EmissionOrder
from odb_lightning.lit.model.token_target import batching_for_steps, group_budget_cap

BUDGET, ORDER = "batching.token_budget", "batching.policy.emission_order"


@pytest.mark.parametrize(
    ("tokens_per_step", "cap"), [(1, 256), (255, 256), (1870, 1792), (2048, 2048), (2303, 2048)]
)
def test_the_cap_is_the_step_tokens_rounded_down_to_a_quantum(tokens_per_step: int, cap: int):
    assert group_budget_cap(tokens_per_step) == cap


def test_a_budget_over_the_step_tokens_is_lowered_and_the_order_paired() -> None:
    steps = batching_for_steps(BatchingConfig.of(token_budget=4096, seed=3), 1870)
    assert steps.batching.token_budget == 1792
    assert steps.batching.policy.emission_order is EmissionOrder.PAIRED
    assert steps.batching.seed == 3, "nothing else changes"
    assert steps.resolved is not None and steps.advice is None
    assert steps.resolved.startswith(
        f"{BUDGET}=1792 (from 4096) and {ORDER}=paired for model.step.tokens_per_step=1870: "
    )


def test_a_budget_at_or_below_the_cap_is_kept() -> None:
    steps = batching_for_steps(BatchingConfig.of(token_budget=1024), 1870)
    assert steps.batching.token_budget == 1024
    assert steps.batching.policy.emission_order is EmissionOrder.PAIRED
    assert steps.resolved is not None and BUDGET not in steps.resolved


def test_named_keys_are_kept_and_a_few_groups_budget_is_warned_about() -> None:
    batching = BatchingConfig.of(token_budget=4096)
    steps = batching_for_steps(batching, 720, named={BUDGET, ORDER})
    assert steps.batching == batching and steps.resolved is None
    assert steps.advice is not None
    assert f"{BUDGET}=4096 is over 2x model.step.tokens_per_step=720" in steps.advice
    assert "it then takes 512" in steps.advice
    # Within twice the step's tokens a named budget is kept without a warning (the quality
    # study's in-band arm: budget 2,048 for N about 1,870).
    assert batching_for_steps(BatchingConfig.of(token_budget=2048), 1872, {BUDGET}).advice is None


def test_auto_stays_auto_with_the_cap_as_its_ceiling() -> None:
    steps = batching_for_steps(BatchingConfig.of(token_budget="auto"), 4000)
    assert steps.batching.token_budget == "auto"
    assert steps.auto_ceiling == 3840
    assert steps.resolved is not None and f"{BUDGET}=auto at most 3840" in steps.resolved
    named = batching_for_steps(BatchingConfig.of(token_budget="auto"), 4000, {BUDGET})
    assert named.auto_ceiling is None


@pytest.mark.parametrize(
    ("tokens_per_step", "batching"),
    [
        (None, BatchingConfig.of(token_budget=4096)),  # no token-target steps
        (720, BatchingConfig.of(token_budget=4096, mode="standard")),  # the budget is unused
    ],
    ids=["no_token_target", "fixed_size_mode"],
)
def test_nothing_changes_without_token_target_steps_or_an_online_mode(
    tokens_per_step: int | None, batching: BatchingConfig
) -> None:
    assert batching_for_steps(batching, tokens_per_step) == batching_for_steps(batching, None)
    assert batching_for_steps(batching, tokens_per_step).batching is batching


def test_the_data_module_gets_the_resolved_batching_and_the_run_says_why(
    compose_cfg: ComposeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="odb_lightning.app.components"):
        data = build_data(compose_cfg(["debug=smoke", "model.step.tokens_per_step=300"]), 1, "cpu")
    assert data.datamodule.batching is data.batching
    assert data.batching.token_budget == 256
    assert data.batching.policy.emission_order is EmissionOrder.PAIRED
    assert any(
        r.getMessage().startswith(f"{BUDGET}=256 (from 4096) and {ORDER}=paired for model.")
        for r in caplog.records
    )


def test_a_budget_named_on_the_command_line_is_kept_with_the_warning(
    compose_cfg: ComposeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = compose_cfg(["debug=smoke", f"{BUDGET}=4096", "model.step.tokens_per_step=100"])
    with caplog.at_level(logging.INFO, logger="odb_lightning.app.components"):
        data = build_data(cfg, 1, "cpu")
    assert data.batching.token_budget == 4096
    assert data.batching.policy.emission_order is EmissionOrder.PAIRED  # not named
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{BUDGET}=4096 is over 2x model.step.tokens_per_step=100" in m for m in warnings)


def test_a_bad_tokens_per_step_is_refused_by_its_key(compose_cfg: ComposeConfig) -> None:
    with pytest.raises(Exception, match="model.step.tokens_per_step must be"):
        build_data(compose_cfg(["debug=smoke", "model.step.tokens_per_step=0"]), 1, "cpu")


def test_a_resume_keeps_the_budget_its_runs_command_line_named(
    compose_cfg: ComposeConfig, tmp_path: Path
) -> None:
    # The run named the budget (4096, kept with the warning); its resume's command line
    # names only the checkpoint, yet batches as the run did: the keys its run's command
    # line set come from the checkpoint.
    checkpoint = tmp_path / "last.ckpt"
    overrides = ["debug=smoke", f"+{BUDGET}=4096", "model.step.tokens_per_step=100"]
    torch.save({RUN_CONFIG_KEY: {"config": {}, "overrides": overrides}}, checkpoint)
    resumed = saved_override_keys(checkpoint)
    assert resumed == {"debug", BUDGET, "model.step.tokens_per_step"}
    cfg = compose_cfg(["debug=smoke", "model.step.tokens_per_step=100"])
    assert build_data(cfg, 1, "cpu", resumed_keys=resumed).batching.token_budget == 4096
    assert build_data(cfg, 1, "cpu").batching.token_budget == 256  # a fresh run resolves it
    assert saved_override_keys(tmp_path / "absent.ckpt") == frozenset()
