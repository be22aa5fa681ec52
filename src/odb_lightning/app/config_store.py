"""Hydra nodes generated from the configuration dataclasses: each default is written once.

The dataclasses (their fields, defaults, docs under each field and checks in
``__post_init__``) are the only place a default lives. :func:`node_of` turns one into a
plain ``_target_`` node with those defaults (Enums as their values, tuples as lists,
nested dataclass defaults as nested nodes), and :func:`register_configs` stores the nodes
in Hydra's ``ConfigStore`` before anything composes ``conf/train.yaml``. The YAML files
under ``conf/`` then hold presets only: the values that differ from the defaults.

Plain nodes rather than typed structured configs: the dataclasses validate themselves
(with messages naming the Hydra key), and some fields are unions OmegaConf cannot type
(``token_budget: int | str``).
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore

from odb_lightning.app.run_dir import register_run_name_resolver
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.modes import MODES, Mode


def target_of(cls: type) -> str:
    """The ``_target_`` string of a class: its module and qualified name."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return node_of(type(value), **{f.name: getattr(value, f.name) for f in _fields(value)})
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _fields(obj: Any) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(obj) if f.init]


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "???"  # Hydra's mandatory value: composing without it fails naming the key


def node_of(cls: type, **overrides: Any) -> dict[str, Any]:
    """A ``_target_`` node of dataclass ``cls``: every init field with its default (or
    ``overrides[name]``), as plain values Hydra can hold."""
    unknown = set(overrides) - {f.name for f in _fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    node: dict[str, Any] = {"_target_": target_of(cls)}
    for field in _fields(cls):
        node[field.name] = _plain(overrides.get(field.name, _default(field)))
    return node


def register_configs() -> None:
    """Store every generated node in Hydra's ``ConfigStore`` (call it before composing
    ``conf/train.yaml`` or ``conf/eval.yaml``; storing again replaces the same nodes)."""
    store = ConfigStore.instance()
    for group, name, node in _generated_nodes():
        store.store(group=group, name=name, node=node)


def batching_node(mode: Mode) -> dict[str, Any]:
    """The ``batching`` option of ``mode``: the defaults of :class:`BatchingConfig` with the
    mode's policy and row layout nodes whole, and the run's ``seed``."""
    return node_of(BatchingConfig, seed="${seed}", policy=mode.policy(), rows=mode.rows())


def _generated_nodes() -> list[tuple[str, str, dict[str, Any]]]:
    """``(group, option, node)`` of every generated config option."""
    return [("batching", mode.name, batching_node(mode)) for mode in MODES.values()]


def prepare_composition() -> None:
    """Everything ``conf/`` needs before Hydra composes it: the generated nodes and the
    run-directory resolvers (``${odb.run_name:...}``)."""
    register_configs()
    register_run_name_resolver()
