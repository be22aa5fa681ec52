"""Validated options of :class:`~odb_lightning.runtime.loader.ODBLoader`."""

from __future__ import annotations

import math
import multiprocessing
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from odb_lightning.core.settings import LoaderSettings


class OnBadSample(Enum):
    """What a bad sample (see :mod:`~odb_lightning.runtime.samples`) does."""

    RAISE = "raise"
    SKIP = "skip"


class StartMethod(Enum):
    """``multiprocessing`` start method of the worker and collate processes."""

    FORK = "fork"
    SPAWN = "spawn"
    FORKSERVER = "forkserver"


EnumT = TypeVar("EnumT", bound=Enum)


def coerce_enum(kind: type[EnumT], name: str, value: Enum | str) -> EnumT:
    """``value`` (a member, its value, or a member of another Enum with the same values,
    e.g. a config schema's) as a member of ``kind``; the error names the option ``name``."""
    try:
        return kind(value.value if isinstance(value, Enum) else value)
    except ValueError:
        allowed = [member.value for member in kind]
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}") from None


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class LoaderOptions:
    """Every knob of one rank's loader (see :class:`ODBLoader` for their meaning).

    Enum fields also accept their string values (``on_bad_sample="skip"``). Errors name
    the offending field.
    """

    token_budget: int
    outstanding_depth: int = 256
    num_workers: int = 2
    join: bool = True
    seed: int = 0
    multiprocessing_context: StartMethod | None = None
    max_steps_per_round: int = 8
    max_seq_len: int | None = None
    on_bad_sample: OnBadSample = OnBadSample.RAISE
    timeout_s: float = 60.0
    alignment_timeout_s: float = 60.0
    persistent_workers: bool = False
    pad_id: int = 0
    attention_weight: float = 0.0
    packed: bool = False

    def __post_init__(self) -> None:
        self._coerce_enums()
        for name in ("join", "persistent_workers", "packed"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        # Building the settings validates token_budget, outstanding_depth, seed and the budget.
        self.settings  # noqa: B018
        _check_int("num_workers", self.num_workers, 0)
        _check_int("pad_id", self.pad_id, 0)
        _check_seconds("timeout_s", self.timeout_s)
        _check_seconds("alignment_timeout_s", self.alignment_timeout_s)
        if self.max_seq_len is not None:
            _check_int("max_seq_len", self.max_seq_len, 1)
            if self.max_seq_len > self.token_budget:
                raise ValueError(
                    f"max_seq_len ({self.max_seq_len}) must not exceed token_budget "
                    f"({self.token_budget}): a full-length sample would not fit one step"
                )

    def _coerce_enums(self) -> None:
        bad_sample = coerce_enum(OnBadSample, "on_bad_sample", self.on_bad_sample)
        object.__setattr__(self, "on_bad_sample", bad_sample)
        if self.multiprocessing_context is None:
            return
        method = coerce_enum(StartMethod, "multiprocessing_context", self.multiprocessing_context)
        if method.value not in multiprocessing.get_all_start_methods():
            raise ValueError(f"multiprocessing_context {method.value!r} is not available here")
        object.__setattr__(self, "multiprocessing_context", method)

    @property
    def settings(self) -> LoaderSettings:
        """The settings every rank must share (checked by the handshake)."""
        return LoaderSettings(
            token_budget=self.token_budget,
            outstanding_depth=self.outstanding_depth,
            max_steps_per_round=self.max_steps_per_round,
            join=self.join,
            seed=self.seed,
            attention_weight=self.attention_weight,
            packed=self.packed,
        )

    @property
    def output_slots(self) -> int:
        """Batches the collate process may have queued for the main process (``2 Q``)."""
        return 2 * self.max_steps_per_round
