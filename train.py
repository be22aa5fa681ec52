"""Train with Online Dynamic Batching: `python train.py experiment=sharegpt_odb`."""

import hydra
from omegaconf import DictConfig

from odb_lightning.app.config_store import prepare_composition
from odb_lightning.app.train import main as run_job

# Before Hydra composes: the generated config nodes and the ${odb.run_name:...} resolver.
prepare_composition()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    run_job(cfg)


if __name__ == "__main__":
    main()
