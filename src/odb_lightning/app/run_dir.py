"""One run directory per job: the name every process of the job agrees on before Hydra
creates the directory.

``conf/train.yaml`` names the run directory ``outputs/${task_name}/${odb.run_name:...}``.
Lightning's own DDP launcher passes rank 0's resolved directory to the processes it
starts, but torchrun and srun start every process on its own: with ``${now:}`` each
resolves its own clock, and one job's files land in as many directories as the
processes disagree on the second. :func:`run_name` decides instead, in this order:

1. torchrun with its agent's store (``TORCHELASTIC_USE_AGENT_STORE=True``, the default of
   the static and c10d rendezvous): the store at ``MASTER_ADDR:MASTER_PORT`` is hosted by
   node 0's agent and is up before any worker starts, so global rank 0 publishes its
   clock there under a key of the rendezvous id and ``TORCHELASTIC_RESTART_COUNT``, and
   the other ranks read it. A restarted worker group gets a directory of its own, and the
   failed attempt's files stay as they were.
2. srun starting several tasks: ``slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>``, equal on every
   task of the step without any exchange; the step keeps several sruns of one allocation
   apart. (One task, as in an salloc shell or a batch script without srun, is case 4.)
3. torchrun without the agent's store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) and more
   than one rank: nothing to agree on before the process group exists, so an error that
   says to pass ``hydra.run.dir``.
4. Otherwise (one process; Lightning's launcher, whose children get the directory as an
   override and never resolve this): this process's clock.

A directory given as ``hydra.run.dir=...`` on the command line replaces all of this.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

from omegaconf import OmegaConf

RESOLVER = "odb.run_name"
"""Name of the OmegaConf resolver (``${odb.run_name:<strftime pattern>,<timeout_s>}``)."""


class RunDirError(RuntimeError):
    """The processes of a job cannot agree on one run directory; the message says what to set."""


def srun_tasks(environ: Mapping[str, str]) -> int:
    """Tasks of the srun step this process belongs to (1 when srun did not start it)."""
    if "SLURM_PROCID" not in environ:
        return 1
    return int(environ.get("SLURM_NTASKS", "1"))


def run_name_key(environ: Mapping[str, str]) -> str:
    """Store key of the run name of this torchrun attempt (equal on every rank of it)."""
    run_id = environ["TORCHELASTIC_RUN_ID"]
    return f"odb_lightning/run_name/{run_id}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def published_run_name(pattern: str, timeout_s: float, environ: Mapping[str, str]) -> str:
    """Global rank 0's clock, formatted with ``pattern``, through torchrun's agent store.

    Raises:
        MetadataChannelError: ``MASTER_ADDR`` does not resolve (the message names it).
        RunDirError: The store is unreachable, or rank 0 published nothing in ``timeout_s``.
    """
    # Here, not at the top: composing the config (odb-check) must not load torch.
    import torch.distributed as dist

    from odb_lightning.runtime.rendezvous import job_store_address

    host, port = job_store_address(dict(environ))
    rank, key = int(environ.get("RANK", "0")), run_name_key(environ)
    timeout = timedelta(seconds=timeout_s)
    where = f"torchrun's agent store at MASTER_ADDR:MASTER_PORT ({host}:{port})"
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    except RuntimeError as error:  # torch's DistStoreError / DistNetworkError
        raise RunDirError(
            f"rank {rank} could not reach {where} within {timeout_s}s to agree on the run "
            f"directory: {error}. Check MASTER_ADDR, or pass hydra.run.dir=<dir> to every node"
        ) from error
    if rank == 0:
        name = datetime.now().strftime(pattern)
        store.set(key, name)
        return name
    try:
        store.wait([key], timeout)
    except RuntimeError as error:
        raise RunDirError(
            f"rank {rank} waited {timeout_s}s for global rank 0 to publish the run directory "
            f"name under {key!r} on {where}: {error}. Rank 0 stopped before composing its "
            "config (see its log), or runs another job: pass hydra.run.dir=<dir> to every node"
        ) from error
    return store.get(key).decode()


def run_name(pattern: str, timeout_s: float, environ: Mapping[str, str] | None = None) -> str:
    """The leaf name of the run directory, equal on every process of the job.

    Args:
        pattern: ``strftime`` pattern of the timestamp (all but the SLURM case use one).
        timeout_s: How long ranks > 0 wait for rank 0's name under torchrun.
        environ: The environment (``os.environ`` when ``None``).

    Raises:
        RunDirError: The processes cannot agree (see the module docstring).
    """
    env = os.environ if environ is None else environ
    torchrun = "TORCHELASTIC_RUN_ID" in env
    if torchrun and env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
        return published_run_name(pattern, timeout_s, env)
    if srun_tasks(env) > 1:
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    if torchrun and int(env.get("WORLD_SIZE", "1")) > 1:
        raise RunDirError(
            "torchrun runs without its agent's store (TORCHELASTIC_USE_AGENT_STORE="
            f"{env.get('TORCHELASTIC_USE_AGENT_STORE')!r}, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="
            f"{env.get('TORCH_DISABLE_SHARE_RDZV_TCP_STORE')!r}), so the ranks cannot agree on "
            "a run directory before training starts: pass hydra.run.dir=<dir> to every node"
        )
    return datetime.now().strftime(pattern)


@functools.cache
def _run_name_once(pattern: str, timeout_s: float) -> str:
    # Once per process: Hydra resolves hydra.run.dir more than once (the job, the sweep
    # dir under it, Lightning's launcher reading HydraConfig), and every answer must agree.
    return run_name(pattern, float(timeout_s))


PROCESS_TAG_RESOLVER = "odb.process_tag"
"""Resolver of the suffix that keeps the Hydra files of ranks > 0 apart in the shared run
directory (``${odb.process_tag:}``)."""


def process_tag(environ: Mapping[str, str] | None = None) -> str:
    """``""`` for global rank 0 and for processes no external launcher started, else
    ``_rank<r>``: under torchrun and srun every process writes Hydra's ``.hydra/`` and the
    job log itself, so ranks > 0 write ``.hydra_rank<r>/`` and ``train_rank<r>.log``.
    (Lightning's own launcher passes its children ``hydra.output_subdir=null`` and a job
    name instead.)"""
    env = os.environ if environ is None else environ
    rank = env.get("RANK")
    if rank is None and srun_tasks(env) > 1:
        rank = env.get("SLURM_PROCID")
    return "" if rank in (None, "0") else f"_rank{rank}"


LIGHTNING_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where Lightning reads a process's rank when it is imported (the first one set)."""


def lightning_rank(environ: Mapping[str, str] | None = None) -> int:
    """The rank Lightning gives this process when it is imported (``rank_zero_only.rank``:
    the first of :data:`LIGHTNING_RANK_VARIABLES` set, else 0), read without importing
    it: the Hydra callbacks and the checks before the run (``train.py``) decide their
    rank-0 work before Lightning loads (``tests/unit/app/test_run_dir.py`` compares)."""
    env = os.environ if environ is None else environ
    rank = next((env[k] for k in LIGHTNING_RANK_VARIABLES if k in env), None)
    return int(rank or 0)


RESUME_DIR_RESOLVER = "odb.resume_dir"
"""Resolver of the run directory of a resume (``${odb.resume_dir:${ckpt_path},<new dir>}``)."""

CHECKPOINT_DIR_NAME = "checkpoints"
"""Where the run's checkpoints lie inside its directory (``conf/callbacks/default.yaml``)."""


def resume_dir(ckpt_path: str | None, new_dir: str) -> str:
    """The run directory of a job: that of the run whose checkpoint it resumes
    (``<run>/checkpoints/<name>.ckpt``, file or sharded directory), so that a resumed run
    continues in its own directory; ``new_dir`` for a new run or a checkpoint from
    elsewhere; with ``ckpt_path=auto`` the run directory named as for a new run, but under
    SLURM one a requeued job finds again (:func:`auto_resume_dir`)."""
    if not ckpt_path:
        return new_dir
    if ckpt_path == AUTO_RESUME:
        return auto_resume_dir(new_dir)
    path = Path(ckpt_path)
    if path.parent.name == CHECKPOINT_DIR_NAME and path.parent.parent.is_dir():
        return os.fspath(path.parent.parent.absolute())
    return new_dir


AUTO_RESUME = "auto"
"""``ckpt_path=auto`` (``app/checkpoints.py``: the newest valid checkpoint of the run
directory, or a new run)."""


def auto_resume_dir(new_dir: str, environ: Mapping[str, str] | None = None) -> str:
    """The run directory of ``ckpt_path=auto``: ``new_dir``, except inside a SLURM job,
    whose requeued attempt keeps its job id but not its clock: there the leaf is
    ``slurm-<job>`` (``slurm-<array job>_<task>``; several tasks of one srun step already
    have ``slurm-<job>.<step>``, the same on every attempt)."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID")
    leaf = Path(new_dir).name
    if job is None or leaf.startswith("slurm-"):
        return new_dir
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    name = f"slurm-{array_job}_{task}" if array_job and task else f"slurm-{job}"
    return os.fspath(Path(new_dir).parent / name)


RESUME_TAG_RESOLVER = "odb.resume_tag"
"""Resolver of the suffix that keeps a resume's Hydra files beside the first run's."""


@functools.cache
def resume_tag(ckpt_path: str | None) -> str:
    """``""`` for a new run, else ``_resumed-<this process's clock>``: a resume writes its
    ``.hydra`` files beside the original run's instead of over them (once per process,
    like :func:`_run_name_once`)."""
    if not ckpt_path:
        return ""
    # auto may start anew: each attempt's files under their own name, none overwritten.
    kind = "attempt" if ckpt_path == AUTO_RESUME else "resumed"
    return datetime.now().strftime(f"_{kind}-%Y-%m-%d_%H-%M-%S")


RUN_LABEL_RESOLVER = "odb.run_label"
"""Resolver of a run's display name (``${odb.run_label:${experiment_name},<overrides>}``)."""


def run_label(experiment_name: str, overrides: str | None) -> str:
    """``experiment_name``, followed by the command line's overrides when there are some
    (Hydra's ``job.override_dirname``: ``key=value`` pairs joined by commas)."""
    return f"{experiment_name} {overrides}" if overrides else str(experiment_name)


def register_run_name_resolver() -> None:
    """Register ``${odb.run_name:...}``, ``${odb.process_tag:}``, ``${odb.resume_dir:...}``,
    ``${odb.resume_tag:...}`` and ``${odb.run_label:...}``; call it before Hydra composes
    the config."""
    OmegaConf.register_new_resolver(RESOLVER, _run_name_once, replace=True)
    OmegaConf.register_new_resolver(PROCESS_TAG_RESOLVER, process_tag, replace=True)
    OmegaConf.register_new_resolver(RESUME_DIR_RESOLVER, resume_dir, replace=True)
    OmegaConf.register_new_resolver(RESUME_TAG_RESOLVER, resume_tag, replace=True)
    OmegaConf.register_new_resolver(RUN_LABEL_RESOLVER, run_label, replace=True)
