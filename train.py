"""Train with Online Dynamic Batching: `python train.py experiment=sharegpt_odb`."""

import hydra
from omegaconf import DictConfig

from odb_lightning.app.train import run


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
