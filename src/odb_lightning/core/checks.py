"""The validators every configuration dataclass shares; each message starts with the
full Hydra key it is about (``batching.policy.outstanding_depth must be ...``)."""

from __future__ import annotations

import math
from enum import Enum
from typing import TypeVar

EnumT = TypeVar("EnumT", bound=Enum)


def is_int(value: object) -> bool:
    """An integer that is not a bool (``True`` is an ``int`` in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: object, least: int) -> bool:
    """An integer (not a bool) of at least ``least``."""
    return is_int(value) and value >= least  # type: ignore[operator]


def is_number(value: object) -> bool:
    """An integer or a float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def enum_member(kind: type[EnumT], key: str, value: object) -> EnumT:
    """``value`` (a member, its value, or a member of another Enum with the same values,
    as OmegaConf schemas hold them) as a member of ``kind``."""
    try:
        return kind(value.value if isinstance(value, Enum) else value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}") from None


def check_positive_int(key: str, value: object, *, optional: bool = False) -> None:
    """A positive integer (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    if not is_count(value, 1):
        null = " or null" if optional else ""
        raise ValueError(f"{key} must be a positive integer{null}, got {value!r}")


def check_int(key: str, value: object, *, least: int | None = None) -> None:
    """An integer, at least ``least`` when given."""
    if not (is_int(value) if least is None else is_count(value, least)):
        bound = "" if least is None else f" >= {least}"
        raise ValueError(f"{key} must be an integer{bound}, got {value!r}")


def check_weight(key: str, value: object) -> None:
    """A finite number ``>= 0`` (the weight of a quadratic cost term)."""
    if not (is_number(value) and math.isfinite(value) and value >= 0):  # type: ignore[arg-type]
        raise ValueError(f"{key} must be finite and >= 0, got {value!r}")


def check_positive(key: str, value: object, unit: str, *, optional: bool = False) -> None:
    """A finite number ``> 0`` of ``unit`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    if not (is_number(value) and math.isfinite(value) and value > 0):  # type: ignore[arg-type]
        null = " or null" if optional else ""
        raise ValueError(f"{key} must be a positive number of {unit}{null}, got {value!r}")


def check_bool(key: str, value: object) -> None:
    """A bool (YAML's ``true``/``false``), not a truthy integer or string."""
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be a bool, got {value!r}")
