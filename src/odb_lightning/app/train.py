"""The training application: the only layer that reads a Hydra ``DictConfig``."""

from __future__ import annotations

import json
import logging
import shlex
import signal
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from odb_lightning.app.checkpoints import check_strategy_reads, resolve_resume_checkpoint
from odb_lightning.app.components import build_callbacks, build_parts, check_world, launched_world
from odb_lightning.app.config_store import prepare_composition
from odb_lightning.app.job_lifetime import end_with_launcher, mark_launcher
from odb_lightning.app.run_config import (
    RunConfigCheckpoint,
    config_for_resume,
    saved_override_keys,
    saved_run_config,
    shape_conflict,
)
from odb_lightning.app.run_dir import AUTO_RESUME, CHECKPOINT_DIR_NAME
from odb_lightning.app.run_log import (
    failed_marker,
    full_error_requested,
    is_user_error,
    log_summary_table,
    record_failure,
    route_library_logs,
)
from odb_lightning.app.validation import (
    check_launch_environment,
    instantiate_checked,
    validate_config,
)
from odb_lightning.app.wandb_run import wandb_run_ids
from odb_lightning.lit.callbacks.graceful_stop import (
    EXIT_CODES,
    REQUEUE_SIGNALS,
    GracefulStop,
)
from odb_lightning.lit.callbacks.job_processes import reap_children
from odb_lightning.lit.callbacks.slurm_requeue import (
    not_requeued_message,
    requeue_slurm_job,
    slurm_job_to_requeue,
)
from odb_lightning.lit.callbacks.summary_table import print_summary
from odb_lightning.lit.job_store import bind_job_store
from odb_lightning.lit.memory.warmup import enable_expandable_segments
from odb_lightning.lit.run_files import write_run_file

# conf/train.yaml's run directory and Hydra file names use these resolvers: whoever runs
# the application composes that config after importing this module.
prepare_composition()

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
"""Exit status of a run stopped by SIGTERM (the shell's convention)."""

log = logging.getLogger(__name__)


def instantiate_group(
    cfg: DictConfig | None, arguments: dict[str, dict[str, Any]] | None = None
) -> list[Any]:
    """Instantiate every ``_target_`` entry of a dict-of-configs group (callbacks, logger),
    with ``arguments[name]`` added to entry ``name``'s."""
    if not cfg:
        return []
    arguments = arguments or {}
    return [
        hydra.utils.instantiate(entry, **arguments.get(name, {}))
        for name, entry in cfg.items()
        if "_target_" in entry
    ]


def finish_wandb_runs(loggers: list[Any], exit_code: int = 0) -> None:
    """Finish the W&B run of every ``WandbLogger`` (a no-op on ranks > 0).

    ``WandbLogger`` never finishes its run, and a new ``WandbLogger`` reuses a run still
    open in the process: without this, the next job of a Hydra multirun (same process)
    would log into this job's W&B run and get no run directory of its own.
    """
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.finish(exit_code=exit_code)


REAP_TIMEOUT_S = 30.0
"""How long rank 0 waits, at its end, for the other processes of the job it started."""


def reap_job(trainer: pl.Trainer) -> None:
    """Rank 0 returns only once every process of the job it started (the other ranks of
    Lightning's launcher, already ending, and its loader processes) has exited and been
    reaped."""
    if trainer.is_global_zero:
        launcher = trainer.strategy.launcher  # Lightning's; None when it starts nothing
        # Its launchers that start processes keep them in ``procs``.
        started = getattr(launcher, "procs", [])
        left = reap_children(REAP_TIMEOUT_S, [p.pid for p in started])
        if left:
            log.error("processes %s of the job still run %gs after the fit", left, REAP_TIMEOUT_S)


def resume_command(checkpoint: Path) -> str:
    """A pasteable command that resumes from ``checkpoint`` (quoted for the shell and for
    Hydra's parser, which rejects a bare ``=`` in a value)."""
    return "python train.py " + shlex.quote(f'ckpt_path="{checkpoint}"')


def report_stop(stop: GracefulStop, summary: dict[str, Any]) -> None:
    """The stop in the summary (``summary["stop"]``) and on the console (rank 0)."""
    entries = stop.stop_entries()
    checkpoint = Path(entries["stop_checkpoint"])
    last = checkpoint.parent / "last.ckpt"
    entries["resume_command"] = resume_command(last if last.exists() else checkpoint)
    summary["stop"] = entries
    log.warning(
        "the run did not finish: stopped by %s after optimizer step %d, checkpoint %s "
        "written (validation skipped). Resume with:\n  %s",
        entries["stopped_by"], entries["stopped_after_step"], checkpoint,
        entries["resume_command"],
    )  # fmt: skip


def exit_stopped(
    stop: GracefulStop, trainer: pl.Trainer, loggers: list[Any], resumes: bool = True
) -> None:
    """Leave as a stopped job: 143 (SIGTERM), 130 (SIGINT); SIGUSR1 and SIGUSR2 requeue the
    SLURM job (rank 0) and exit 0, or outside SLURM say that nothing requeues it and exit
    138 or 140. The checkpoint of the stop is already written on every rank. The other
    ranks of Lightning's launcher exit 0 (:meth:`GracefulStop.exit_code`). Without
    ``resumes`` (``ckpt_path=auto``) the requeued attempt starts over, and the log says so."""
    signum = stop.stopped_by
    assert signum is not None
    job = slurm_job_to_requeue() if signum in REQUEUE_SIGNALS else None
    if job is not None:
        finish_wandb_runs(loggers, exit_code=0)
        status = requeue_slurm_job(job) if trainer.is_global_zero else 0
        if status == 0 and not resumes and trainer.is_global_zero:
            log.warning(
                "the requeued attempt runs this command again, which starts over without "
                "ckpt_path=auto (the newest checkpoint of its run directory): pass it, as "
                "launcher=slurm and the sbatch examples do"
            )
        raise SystemExit(0 if status == 0 else 1)
    code = stop.exit_code(signum)
    if signum in REQUEUE_SIGNALS and trainer.is_global_zero:
        log.warning(not_requeued_message(signum, code))
    finish_wandb_runs(loggers, exit_code=EXIT_CODES[signum])
    raise SystemExit(code)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Build everything from ``cfg``, fit, and return the run summary. A resume
    (``ckpt_path``) runs with the checkpoint's config, updated by this command line's
    overrides (:mod:`odb_lightning.app.run_config`); ``ckpt_path=auto`` resumes from the
    newest valid checkpoint of the run directory, or starts anew there."""
    checkpoint_dir = Path(cfg.paths.output_dir) / CHECKPOINT_DIR_NAME
    auto_resume = cfg.get("ckpt_path") == AUTO_RESUME  # what a requeued attempt does
    ckpt_path = resolve_resume_checkpoint(cfg.get("ckpt_path"), checkpoint_dir)
    if ckpt_path is not None:
        cfg = config_for_resume(cfg, ckpt_path)
    validate_config(cfg)
    # Always on: stop signals are agreed on at step boundaries (lit/callbacks/graceful_stop.py),
    # and recorded from here on, so that one during the setup stops the run too.
    stop = GracefulStop(instantiate_checked(cfg.stop, "stop"))
    stop.record_from_now()
    try:
        return _fit(cfg, stop, ckpt_path, auto_resume)
    except Exception:
        stop.finish()  # a failed run: the handlers of before it back (a stop exits instead)
        raise


def _fit(
    cfg: DictConfig, stop: GracefulStop, ckpt_path: str | None, auto_resume: bool
) -> dict[str, Any]:
    """:func:`run`'s work once the stop signals are recorded: build the parts, fit, and
    write the summary."""
    check_launch_environment()
    # Before the first CUDA allocation: ODB's changing shapes fragment fixed segments.
    enable_expandable_segments()
    # A resume keeps the values its run's command line chose where the run resolves its own.
    resumed_keys = saved_override_keys(ckpt_path) if ckpt_path is not None else frozenset()
    parts = build_parts(cfg, *launched_world(cfg.trainer), resumed_keys=resumed_keys)
    wired = build_callbacks(cfg.get("callbacks"), parts)
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    saves_config = RunConfigCheckpoint(cfg, overrides)
    callbacks = [*wired.callbacks, stop, saves_config]
    output_dir, resuming = Path(cfg.paths.output_dir), ckpt_path is not None
    logger_cfg = cfg.get("logger")
    loggers = instantiate_group(logger_cfg, wandb_run_ids(logger_cfg, output_dir, resuming))
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False
    )
    check_world(trainer, parts.run)
    if ckpt_path is not None:
        check_strategy_reads(ckpt_path, trainer.strategy)
    model, datamodule = parts.model, parts.datamodule
    for logger in loggers:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    # Rank 0: the job's store on MASTER_ADDR only; the default group's store reuses it.
    job_store = bind_job_store(trainer)
    try:
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        except RuntimeError as error:
            if ckpt_path is None or "size mismatch" not in str(error):
                raise
            resolved = OmegaConf.to_container(cfg, resolve=True)
            raise shape_conflict(ckpt_path, saved_run_config(ckpt_path), resolved, error) from error
    except SIGTERMException:
        # A SIGTERM before training started (Lightning's handler is replaced from then on).
        finish_wandb_runs(loggers, exit_code=SIGTERM_EXIT_CODE)
        raise SystemExit(SIGTERM_EXIT_CODE) from None
    except BaseException:
        finish_wandb_runs(loggers, exit_code=1)
        raise
    del job_store  # the default group's store holds the server from its first build on
    summary = wired.summary.summary
    if trainer.is_global_zero and stop.stopped_by is not None:
        report_stop(stop, summary)
    if trainer.is_global_zero and summary:
        write_summary(summary, Path(cfg.paths.output_dir))
    reap_job(trainer)
    if stop.stopped_by is not None:
        exit_stopped(stop, trainer, loggers, resumes=auto_resume)
    finish_wandb_runs(loggers)
    return summary


def write_summary(summary: dict[str, Any], output_dir: Path) -> None:
    """``summary.json`` in the run directory, and the end-of-run table on the console."""
    output_dir.mkdir(parents=True, exist_ok=True)
    write_run_file(output_dir / "summary.json", json.dumps(summary, indent=2))
    print_summary(summary)


def main(cfg: DictConfig) -> dict[str, Any]:
    """``train.py``'s job: :func:`run`, with the run directory announced before and after,
    Lightning's messages and any error in ``<run dir>/train.log``, and a failed run marked
    (``failed.json``). An error whose message says what to change (a config error) is
    reported without a traceback and exits 1 in a single run; ``HYDRA_FULL_ERROR=1``, a
    multirun and any other error raise as they are (a multirun goes on with its next job).
    """
    # First: a rank Lightning's launcher started dies with the rank that started it, and
    # the ranks this process starts (in trainer.fit) die with it.
    end_with_launcher()
    mark_launcher()
    route_library_logs()
    output_dir = Path(cfg.paths.output_dir)
    if rank_zero_only.rank == 0:
        log.info("run directory: %s", output_dir)
    try:
        summary = run(cfg)
    except Exception as error:
        record_failure(error, output_dir)
        multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
        if is_user_error(error) and not (full_error_requested() or multirun):
            raise SystemExit(1) from None
        raise
    # A resume that finishes ends what a failed attempt in this directory left marked.
    failed_marker(output_dir, rank_zero_only.rank).unlink(missing_ok=True)
    if rank_zero_only.rank == 0:
        if summary:
            log_summary_table(summary)
        log.info("run directory: %s (summary.json, train.log, checkpoints/)", output_dir)
    return summary
