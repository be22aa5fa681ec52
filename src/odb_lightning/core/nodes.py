"""Configuration objects as plain ``_target_`` nodes, the form Hydra instantiates.

A frozen dataclass becomes ``{"_target_": "<module>.<Class>", field: value, ...}``, a
``functools.partial`` ``{"_target_": ..., "_partial_": True, keyword: value, ...}``, an
Enum its value and a tuple a list, recursively: only plain containers, so a node can be
composed by Hydra, saved in a checkpoint that ``torch.load(weights_only=True)`` reads, and
instantiated back into the same objects.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from functools import partial
from typing import Any


def target_of(obj: Any) -> str:
    """The ``_target_`` string of a class or function: its module and qualified name."""
    return f"{obj.__module__}.{obj.__qualname__}"


def init_fields(obj: Any) -> list[dataclasses.Field]:
    """The fields of a dataclass (or of its instance) that its constructor takes."""
    return [f for f in dataclasses.fields(obj) if f.init]


def plain(value: Any) -> Any:
    """``value`` as plain containers: dataclass instances and partials as nodes (see the
    module docstring), Enums as their values, tuples as lists."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return node_of(type(value), **{f.name: getattr(value, f.name) for f in init_fields(value)})
    if isinstance(value, partial):
        keywords = {key: plain(item) for key, item in value.keywords.items()}
        return {"_target_": target_of(value.func), "_partial_": True, **keywords}
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "???"  # Hydra's mandatory value: composing without it fails naming the key


def node_of(cls: type, **overrides: Any) -> dict[str, Any]:
    """A ``_target_`` node of dataclass ``cls``: every init field with its default (or
    ``overrides[name]``), as plain values Hydra can hold."""
    unknown = set(overrides) - {f.name for f in init_fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    node: dict[str, Any] = {"_target_": target_of(cls)}
    for field in init_fields(cls):
        node[field.name] = plain(overrides.get(field.name, _default(field)))
    return node
