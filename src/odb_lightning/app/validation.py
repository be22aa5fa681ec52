"""Startup checks of the composed config: every error names the key it is about."""

from __future__ import annotations

from typing import Any

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig


class ConfigError(ValueError):
    """The composed configuration is invalid; the message names the key."""


def instantiate_checked(cfg: DictConfig, key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` whose errors name the config group ``key``."""
    try:
        return hydra.utils.instantiate(cfg, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__ or error
        raise ConfigError(f"invalid config '{key}': {cause}") from cause


def validate_config(cfg: DictConfig) -> None:
    """Cross-group checks that no single constructor can make."""
    batching = cfg.batching
    max_seq_len = cfg.data.get("max_seq_len")
    if max_seq_len is not None and max_seq_len > batching.token_budget:
        raise ConfigError(
            f"data.max_seq_len ({max_seq_len}) must not exceed batching.token_budget "
            f"({batching.token_budget}): a sample of max_seq_len tokens must fit one step"
        )
