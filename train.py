"""Train with Online Dynamic Batching: `python train.py experiment=sharegpt_odb`."""

import hydra
from omegaconf import DictConfig

from odb_lightning.app.check import check_run
from odb_lightning.app.config_store import prepare_composition
from odb_lightning.app.job_lifetime import end_with_launcher

# First (the imports above are light): a rank that Lightning's launcher started dies with
# the rank that started it (app/job_lifetime.py).
end_with_launcher()
# Before Hydra composes: the generated config nodes and the ${odb.run_name:...} resolver.
prepare_composition()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    # The config and the first records, checked before torch and Lightning load (odb-check).
    check_run(cfg)
    from odb_lightning.app.train import main as run_job

    run_job(cfg)


if __name__ == "__main__":
    main()
