"""``launcher=slurm`` (conf/launcher/slurm.yaml) composes into Hydra's submitit launcher
with the project's choices: one task per device, our stop signal with a lead time that
holds the whole stop, requeue on, and ``ckpt_path=auto`` for every point."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers.configs import compose_train

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra")


def test_the_slurm_launcher_preset(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, ["launcher=slurm", "trainer=ddp_cpu"])
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.nodes) == (2, 1)  # trainer.devices, num_nodes
    lead = launcher.signal_delay_s
    assert OmegaConf.to_container(launcher.additional_parameters, resolve=True) == {
        "signal": f"USR1@{lead}",
        "requeue": True,
    }
    assert cfg.ckpt_path == "auto"
    assert 0 < cfg.stop.deadline_s < lead
