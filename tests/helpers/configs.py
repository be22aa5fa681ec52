"""The repository's Hydra configs, composed as ``train.py`` composes them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from odb_lightning.app.config_store import prepare_composition

CONF = Path(__file__).resolve().parents[2] / "conf"
SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
ComposeConfig = Callable[[list[str]], DictConfig]
"""What the ``compose_cfg`` fixture gives: overrides in, the composed ``train`` config out."""


def compose_train(tmp_path: Path, overrides: list[str]) -> DictConfig:
    """``conf/train.yaml`` with ``overrides``, its output and root directories in ``tmp_path``."""
    prepare_composition()  # as train.py does before Hydra composes
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path)
            cfg.paths.root_dir = str(tmp_path)
    return cfg
