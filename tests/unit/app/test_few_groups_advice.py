"""Token-target steps under a token budget far above ``tokens_per_step`` hold about one ODB
group each (samples of nearly one length); the run warns at build time and names the fix."""

from __future__ import annotations

import logging

import pytest

from helpers.configs import ComposeConfig
from odb_lightning.app.components import build_parts
from odb_lightning.core.config import BatchingConfig
from odb_lightning.lit.model.token_target import few_groups_advice


def test_a_budget_far_above_the_step_tokens_is_advised_against() -> None:
    advice = few_groups_advice(720, BatchingConfig.of(token_budget=4096))
    assert advice is not None
    assert "batching.token_budget=4096" in advice
    assert "model.step.tokens_per_step=720" in advice
    assert "batching.policy.emission_order=paired" in advice


@pytest.mark.parametrize(
    ("tokens_per_step", "batching"),
    [
        (1872, BatchingConfig.of(token_budget=2048)),  # the quality study's in-band arm
        (2048, BatchingConfig.of(token_budget=4096)),  # exactly the ratio
        (None, BatchingConfig.of(token_budget=4096)),  # no token-target steps
        (720, BatchingConfig.of(token_budget=4096, mode="standard")),  # the budget is unused
        (720, BatchingConfig.of(token_budget="auto")),  # the budget is not known yet
    ],
    ids=["in_band", "at_ratio", "no_token_target", "fixed_size_mode", "auto_budget"],
)
def test_no_advice_where_steps_hold_several_groups_or_no_budget_applies(
    tokens_per_step: int | None, batching: BatchingConfig
) -> None:
    assert few_groups_advice(tokens_per_step, batching) is None


def test_build_parts_logs_the_advice(
    compose_cfg: ComposeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = compose_cfg(
        ["debug=smoke", "batching.token_budget=4096", "model.step.tokens_per_step=100"]
    )
    with caplog.at_level(logging.WARNING, logger="odb_lightning.app.components"):
        build_parts(cfg, world_size=1, device="cpu")
    assert any("model.step.tokens_per_step=100" in record.getMessage() for record in caplog.records)
