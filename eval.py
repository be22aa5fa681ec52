"""Evaluate a checkpoint: `python eval.py ckpt_path=<run>/checkpoints/last.ckpt split=val`."""

import hydra
from omegaconf import DictConfig

from odb_lightning.app.config_store import prepare_composition
from odb_lightning.app.evaluate import main as evaluate

# Before Hydra composes: the generated config nodes and the ${odb.run_name:...} resolver.
prepare_composition()


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    main()
