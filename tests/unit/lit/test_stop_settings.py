"""The stop's deadline is validated once, and the printed resume command is one that the
shell and Hydra's override parser read back as the checkpoint's path."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from odb_lightning.app.config_store import _generated_nodes
from odb_lightning.app.train import resume_command
from odb_lightning.app.validation import ConfigError, instantiate_checked
from odb_lightning.lit.callbacks.stop_settings import StopSettings


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "25"])
def test_a_bad_deadline_is_refused_naming_the_key(value: object) -> None:
    stop = next(n for g, _, n in _generated_nodes() if g == "stop")
    assert stop["deadline_s"] == StopSettings().deadline_s == 25.0  # the default, once
    with pytest.raises(ConfigError, match=r"invalid config 'stop.deadline_s': stop.deadline_s "):
        instantiate_checked(OmegaConf.create({**stop, "deadline_s": value}), "stop")


def test_the_resume_command_reads_back_as_the_path() -> None:
    path = Path("/runs/a b/checkpoints/stop-epoch=0-step=3.ckpt")
    program, script, override = shlex.split(resume_command(path))
    assert (program, script) == ("python", "train.py")
    parsed = OverridesParser.create().parse_overrides([override])[0]
    assert parsed.key_or_group == "ckpt_path" and parsed.value() == str(path)
