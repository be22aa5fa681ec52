"""The mode registry: each batching mode is a policy type with a row layout.

``batching=<mode>`` picks one entry; the Hydra option of every mode is generated from it
(``app/config_store.py``), and :meth:`~odb_lightning.core.config.BatchingConfig.of` reads
``mode=`` through it. A new mode is its policy's file plus one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.policy import (
    BucketedPolicy,
    OraclePolicy,
    Policy,
    SortedPolicy,
    StandardPolicy,
)
from odb_lightning.core.rows import PackedRows, PaddedRows, RowLayout


@dataclass(frozen=True)
class Mode:
    """One batching mode: its name, its policy type and its row layout type."""

    name: str
    policy: type[Policy]
    rows: type[RowLayout]


MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode("standard", StandardPolicy, PaddedRows),
        Mode("sorted", SortedPolicy, PaddedRows),
        Mode("bucketed", BucketedPolicy, PaddedRows),
        Mode("oracle", OraclePolicy, PaddedRows),
        Mode("odb", OnlinePolicy, PaddedRows),
        Mode("odb_packed", OnlinePolicy, PackedRows),
    )
}
"""Every mode by name, in the order the table of ``docs/batching.md`` lists them (the
handshake sends a mode as its index here)."""


def mode_named(name: object) -> Mode:
    """The registered mode ``name`` (a string, or an Enum member of that value)."""
    key = getattr(name, "value", name)
    if key not in MODES:
        raise ValueError(f"batching.mode must be one of {', '.join(MODES)}, got {name!r}")
    return MODES[key]  # type: ignore[index]


def mode_of(policy: Policy, rows: RowLayout) -> Mode:
    """The registered mode of a policy and a row layout."""
    for mode in MODES.values():
        if type(policy) is mode.policy and type(rows) is mode.rows:
            return mode
    raise ValueError(
        f"batching.policy {type(policy).__name__} with batching.rows {type(rows).__name__} "
        f"is no registered mode; the modes are {', '.join(MODES)}"
    )
