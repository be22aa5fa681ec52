"""Every point of every sweep is a valid run of the default experiment (what
``python train.py -m sweep=<name>`` launches, and what experiments/ablation runs)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from helpers.configs import CONF, SWEEPS, ComposeConfig
from odb_lightning.app.validation import instantiate_checked, validate_config


def sweep_points(sweep: str) -> list[tuple[str, str]]:
    params = OmegaConf.load(CONF / "sweep" / f"{sweep}.yaml").hydra.sweeper.params
    return [(key, value) for key, values in params.items() for value in str(values).split(",")]


POINTS = [(sweep, key, value) for sweep in SWEEPS for key, value in sweep_points(sweep)]


def test_sweeps_cover_the_ablation_ranges() -> None:
    budgets = [int(v) for _, v in sweep_points("token_budget")]
    depths = [int(v) for _, v in sweep_points("outstanding_depth")]
    assert budgets == [2048, 4096, 8192, 16384]
    assert depths == [32, 64, 128, 256, 512, 1024]


@pytest.mark.parametrize(("sweep", "key", "value"), POINTS)
def test_sweep_point_validates(
    sweep: str, key: str, value: str, compose_cfg: ComposeConfig
) -> None:
    cfg = compose_cfg([f"sweep={sweep}", f"{key}={value}"])
    validate_config(cfg)  # e.g. data.sizes.max_seq_len <= batching.token_budget at every budget
    batching = instantiate_checked(cfg.batching, "batching")
    assert batching.knob(key.split(".")[-1]) == int(value)
