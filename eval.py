"""Evaluate a checkpoint: `python eval.py ckpt_path=<run>/checkpoints/last.ckpt split=val`."""

import hydra
from omegaconf import DictConfig

from odb_lightning.app.evaluate import main as evaluate
from odb_lightning.app.run_dir import register_run_name_resolver

# Before Hydra composes: the run directory is named with ${odb.run_name:...}.
register_run_name_resolver()


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    main()
