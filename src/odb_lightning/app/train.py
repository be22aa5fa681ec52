"""The training application: the only layer that reads a Hydra ``DictConfig``."""

from __future__ import annotations

import signal
from typing import Any

import hydra
import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from odb_lightning.app.checkpoints import resolve_resume_checkpoint
from odb_lightning.app.run_dir import register_run_name_resolver
from odb_lightning.app.validation import (
    check_launch_environment,
    instantiate_checked,
    validate_config,
)
from odb_lightning.lit.graceful_stop import EXIT_CODES, GracefulStop, requeue_slurm_job

# conf/train.yaml's run directory and Hydra file names use these resolvers: whoever runs
# the application composes that config after importing this module.
register_run_name_resolver()

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
"""Exit status of a run stopped by SIGTERM (the shell's convention)."""


def instantiate_group(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every ``_target_`` entry of a dict-of-configs group (callbacks, logger)."""
    if not cfg:
        return []
    return [hydra.utils.instantiate(entry) for entry in cfg.values() if "_target_" in entry]


def finish_wandb_runs(loggers: list[Any], exit_code: int = 0) -> None:
    """Finish the W&B run of every ``WandbLogger`` (a no-op on ranks > 0).

    ``WandbLogger`` never finishes its run, and a new ``WandbLogger`` reuses a run still
    open in the process: without this, the next job of a Hydra multirun (same process)
    would log into this job's W&B run and get no run directory of its own.
    """
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.finish(exit_code=exit_code)


def exit_stopped(stop: GracefulStop, trainer: pl.Trainer, loggers: list[Any]) -> None:
    """Leave as a stopped job: 143 (SIGTERM), 130 (SIGINT); SIGUSR1 requeues the SLURM job
    (rank 0) and exits 0. The checkpoint of the stop is already written on every rank."""
    signum = stop.stopped_by
    if signum is signal.SIGUSR1:
        finish_wandb_runs(loggers, exit_code=0)
        status = requeue_slurm_job() if trainer.is_global_zero else 0
        raise SystemExit(0 if status == 0 else 1)
    code = EXIT_CODES[signum]
    finish_wandb_runs(loggers, exit_code=code)
    raise SystemExit(code)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Build everything from ``cfg``, fit, and return the run summary."""
    validate_config(cfg)
    check_launch_environment()
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    tokenizer = instantiate_checked(cfg.tokenizer, "tokenizer")
    batching = instantiate_checked(cfg.batching, "batching")
    datamodule = instantiate_checked(
        cfg.data, "data", objects={"tokenizer": tokenizer, "batching": batching}
    )
    # Plain Python arguments: the module's hyperparameters go into every checkpoint, which
    # torch.load(weights_only=True) then reads without OmegaConf types.
    model = instantiate_checked(cfg.model, "model", _convert_="all")
    # Always on: stop signals are agreed on at step boundaries (lit/graceful_stop.py).
    stop = GracefulStop()
    callbacks = [*instantiate_group(cfg.get("callbacks")), stop]
    loggers = instantiate_group(cfg.get("logger"))
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False
    )
    for logger in loggers:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    try:
        trainer.fit(
            model, datamodule=datamodule, ckpt_path=resolve_resume_checkpoint(cfg.get("ckpt_path"))
        )
    except SIGTERMException:
        # A SIGTERM before training started (Lightning's handler is replaced from then on).
        finish_wandb_runs(loggers, exit_code=SIGTERM_EXIT_CODE)
        raise SystemExit(SIGTERM_EXIT_CODE) from None
    except BaseException:
        finish_wandb_runs(loggers, exit_code=1)
        raise
    if stop.stopped_by is not None:
        exit_stopped(stop, trainer, loggers)
    finish_wandb_runs(loggers)
    summaries = [c.summary for c in callbacks if getattr(c, "summary", None)]
    return summaries[0] if summaries else {}
