"""Startup checks of the composed config (every error names the key it is about) and of
the launch environment (every error names the variable to set).

The config checks import neither torch nor Lightning (:mod:`odb_lightning.app.check` runs
them before those load)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig

from odb_lightning.app.run_dir import srun_tasks
from odb_lightning.core.checks import is_int


class ConfigError(ValueError):
    """The composed configuration is invalid; the message names the key."""


class DataCheckError(ValueError):
    """The first records of a source could not be read (``odb-check``, ``train.py``'s
    first step); the message names the source, the path and why."""


def _failing_key(cfg: DictConfig, key: str, message: str) -> str:
    """``key.field`` when ``message`` is about one of ``cfg``'s fields (constructors start
    their messages with the argument name, which equals the YAML key, or with the full
    key, ``batching.policy.outstanding_depth``), else ``key``."""
    if message.startswith(f"{key}."):
        return re.split(r"[\s:=]", message, maxsplit=1)[0]
    fields = sorted((name for name in cfg if isinstance(name, str)), key=len, reverse=True)
    for name in fields:
        for spelled in (f"{key}.{name}", name):
            if message.startswith((f"{spelled} ", f"{spelled}:", f"{spelled}=")):
                return f"{key}.{name}"
    return key


def instantiate_checked(
    cfg: DictConfig, key: str, objects: dict[str, Any] | None = None, **kwargs: Any
) -> Any:
    """``hydra.utils.instantiate`` whose errors name the config key (``batching.loader.timeout_s``,
    or the group ``batching`` when the message names no field).

    ``objects`` are built arguments (a tokenizer, a ``BatchingConfig``) handed to the
    target as they are: Hydra would turn a dataclass passed to ``instantiate`` back into
    a config node.
    """
    try:
        if objects is None:
            return hydra.utils.instantiate(cfg, **kwargs)
        factory = hydra.utils.instantiate(cfg, _partial_=True, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__ or error
        raise ConfigError(
            f"invalid config '{_failing_key(cfg, key, str(cause))}': {cause}"
        ) from cause
    try:
        return factory(**objects)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"invalid config '{_failing_key(cfg, key, str(error))}': {error}"
        ) from error


def validate_config(cfg: DictConfig) -> None:
    """Checks no single constructor makes at startup: the data sizes (by their dataclass,
    before any process starts), and cross-group limits."""
    sizes = instantiate_checked(cfg.data.sizes, "data.sizes")
    budget = cfg.batching.get("token_budget")
    # An invalid budget itself is the batching schema's to report, naming its key.
    if is_int(budget) and budget > 0 and sizes.max_seq_len > budget:
        raise ConfigError(
            f"data.sizes.max_seq_len ({sizes.max_seq_len}) must not exceed "
            f"batching.token_budget ({budget}): a sample of max_seq_len tokens must fit one step"
        )
    _validate_row_attention(cfg)
    _validate_strategy(cfg.get("trainer"))


UNVALIDATED_STRATEGIES = {
    "deepspeed": (
        "DeepSpeed (Lightning's DeepSpeedStrategy)",
        "trainer=gpu8 (DDP) or trainer=gpu8_fsdp (FSDP2, which shards parameters, "
        "gradients and optimizer state as ZeRO-3 does)",
    ),
    "fsdp": (
        "FSDP1 (Lightning's FSDPStrategy)",
        "FSDP2, which ODB is tested with: trainer=gpu8_fsdp on GPUs, trainer=fsdp_cpu on CPU",
    ),
}
"""Strategies that Lightning offers and no ODB test has run, by their registry prefix."""

_STRATEGY_CLASSES = {"DeepSpeedStrategy": "deepspeed", "FSDPStrategy": "fsdp"}


def _validate_strategy(trainer: DictConfig | None) -> None:
    """Refuse a strategy no test of ODB has run (by Lightning's registry name,
    ``deepspeed_stage_2``, or by ``_target_``): its exact loss and IDLE steps are
    unproven there, so it is not trusted silently."""
    strategy = (trainer or {}).get("strategy")
    if isinstance(strategy, str):
        family = next((f for f in UNVALIDATED_STRATEGIES if strategy.startswith(f)), None)
        spelled = strategy
    elif isinstance(strategy, Mapping) and isinstance(strategy.get("_target_"), str):
        family = _STRATEGY_CLASSES.get(strategy["_target_"].rsplit(".", 1)[-1])
        spelled = strategy["_target_"]
    else:
        return
    if family is not None:
        name, instead = UNVALIDATED_STRATEGIES[family]
        raise ConfigError(
            f"trainer.strategy={spelled}: {name} is not validated with ODB (no test or run "
            f"of this project has executed it, so its token-weighted loss and IDLE steps "
            f"are unproven there) and is refused; use {instead}"
        )


def _validate_row_attention(cfg: DictConfig) -> None:
    """The row layout's attention cost against ``model.architecture.attn_implementation``
    (the layout says what it needs:
    :meth:`~odb_lightning.core.rows.RowLayout.attention_mismatch`)."""
    backend = ((cfg.get("model") or {}).get("architecture") or {}).get("attn_implementation")
    if not backend:
        return
    rows = instantiate_checked(cfg.batching.rows, "batching")
    problem = rows.attention_mismatch(str(backend))
    if problem is not None:
        raise ConfigError(problem)


def launched_world_size(environ: Mapping[str, str]) -> int:
    """Processes of a job whose launcher started them (``WORLD_SIZE``: torchrun, a
    scheduler, Lightning's launcher for its children; else srun's task count)."""
    if "WORLD_SIZE" in environ:
        return int(environ["WORLD_SIZE"])
    return srun_tasks(environ)


def check_launch_environment(environ: Mapping[str, str] | None = None) -> None:
    """Fail before the Trainer starts when the ranks of an externally launched job could
    not meet: ``MASTER_ADDR`` must resolve on this node and ``GLOO_SOCKET_IFNAME`` (or
    ``NCCL_SOCKET_IFNAME``), if set, must name an interface of it. Otherwise the default
    process group or the ODB metadata channel would find out only after its timeout.

    The same rules as the metadata channel's (:func:`job_store_address`,
    :func:`gloo_binding`). Under srun without ``MASTER_ADDR``, Lightning derives it from
    ``SLURM_NODELIST`` later; there is nothing to check yet.

    Raises:
        MetadataChannelError: The message names the address and the variable to set.
    """
    # Here, not at the top: the config checks above run before torch loads (odb-check).
    from odb_lightning.runtime.binding import gloo_binding
    from odb_lightning.runtime.errors import MetadataChannelError
    from odb_lightning.runtime.rendezvous import job_store_address

    env = dict(os.environ if environ is None else environ)
    if launched_world_size(env) <= 1 or ("MASTER_ADDR" not in env and srun_tasks(env) > 1):
        return
    host, _ = job_store_address(env)
    try:
        gloo_binding(host, env)
    except OSError as error:  # the route lookup: no route from this node to the host
        raise MetadataChannelError(
            f"this node has no route to MASTER_ADDR {env['MASTER_ADDR']!r} ({host}): {error}: "
            "set MASTER_ADDR to an address of rank 0's node that every node reaches, or "
            "GLOO_SOCKET_IFNAME to the interface that reaches it"
        ) from error
