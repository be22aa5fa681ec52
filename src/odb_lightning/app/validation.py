"""Startup checks of the composed config: every error names the key it is about."""

from __future__ import annotations

from typing import Any

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig


class ConfigError(ValueError):
    """The composed configuration is invalid; the message names the key."""


def _failing_key(cfg: DictConfig, key: str, message: str) -> str:
    """``key.field`` when ``message`` is about one of ``cfg``'s fields (constructors start
    their messages with the argument name, which equals the YAML key), else ``key``."""
    fields = sorted((name for name in cfg if isinstance(name, str)), key=len, reverse=True)
    for name in fields:
        for spelled in (f"{key}.{name}", name):
            if message.startswith((f"{spelled} ", f"{spelled}:", f"{spelled}=")):
                return f"{key}.{name}"
    return key


def instantiate_checked(
    cfg: DictConfig, key: str, objects: dict[str, Any] | None = None, **kwargs: Any
) -> Any:
    """``hydra.utils.instantiate`` whose errors name the config key (``batching.timeout_s``,
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Data knobs that would otherwise fail late (inside DDP setup or the first loader build).
_DATA_MINIMUMS = {"max_seq_len": 1, "val_samples": 0}


def _validate_data(data: DictConfig) -> None:
    for name, least in _DATA_MINIMUMS.items():
        value = data.get(name)
        if value is not None and not (_is_int(value) and value >= least):
            raise ConfigError(f"data.{name} must be an integer >= {least}, got {value!r}")
    max_samples = data.get("max_samples")
    if max_samples is not None and not (_is_int(max_samples) and max_samples >= 1):
        raise ConfigError(f"data.max_samples must be null or an integer >= 1, got {max_samples!r}")


def validate_config(cfg: DictConfig) -> None:
    """Checks no single constructor makes at startup: data knobs that are otherwise only
    checked inside the DDP processes, and cross-group limits."""
    _validate_data(cfg.data)
    budget = cfg.batching.get("token_budget")
    max_seq_len = cfg.data.get("max_seq_len")
    # An invalid budget itself is the batching schema's to report, naming its key.
    if max_seq_len is not None and _is_int(budget) and budget > 0 and max_seq_len > budget:
        raise ConfigError(
            f"data.max_seq_len ({max_seq_len}) must not exceed batching.token_budget "
            f"({budget}): a sample of max_seq_len tokens must fit one step"
        )
