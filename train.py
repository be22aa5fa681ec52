"""Train with Online Dynamic Batching: `python train.py experiment=sharegpt_odb`."""

import hydra
from omegaconf import DictConfig

from odb_lightning.app.run_dir import register_run_name_resolver
from odb_lightning.app.train import main as run_job

# Before Hydra composes: conf/train.yaml names the run directory with ${odb.run_name:...}.
register_run_name_resolver()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    run_job(cfg)


if __name__ == "__main__":
    main()
