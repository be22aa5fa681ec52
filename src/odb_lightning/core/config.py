"""The batching configuration: what every mode shares, and its concerns held whole.

Hydra builds :class:`BatchingConfig` from the ``batching`` group: ``token_budget``,
``seed`` and ``eval_batch_size`` at its top, the mode's policy under ``policy``
(:mod:`~odb_lightning.core.policy`, :mod:`~odb_lightning.core.online_policy`), the row
layout under ``rows`` (:mod:`~odb_lightning.core.rows`) and the loader's process settings
under ``loader`` (:mod:`~odb_lightning.core.loader_config`). Each knob is a field of one
of them, documented and validated there; the loaders, the planner and the simulator take
the object whole, and their keyword form (:meth:`BatchingConfig.of`) routes a flat knob
name to the concern that has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from odb_lightning.core.budget import Budget
from odb_lightning.core.checks import check_int, check_positive_int, is_int
from odb_lightning.core.handshake import settings_message
from odb_lightning.core.loader_config import LoaderConfig
from odb_lightning.core.modes import MODES, Mode, mode_named, mode_of
from odb_lightning.core.online_policy import OnlinePolicy
from odb_lightning.core.patch_budget import PatchBudget
from odb_lightning.core.policy import Policy
from odb_lightning.core.rows import PaddedRows, RowLayout

GROUP = "batching"
"""The Hydra config group of :class:`BatchingConfig`: every message names ``batching.<key>``."""

TOKEN_BUDGET_AUTO = "auto"
"""``batching.token_budget=auto``: found at fit start on the GPU (``lit/memory/warmup.py``)."""


@dataclass(frozen=True)
class BatchingConfig:
    """How batches are formed and how the loader runs. Errors name the Hydra key."""

    token_budget: int | str = 16384
    """``L_max``: most tokens per step, as the row layout counts them; ``auto``: the
    largest budget whose worst-case step fits the GPU, measured at fit start
    (:class:`~odb_lightning.lit.memory.warmup.MemoryWarmup`). The fixed-size modes ignore it."""
    seed: int = 0
    """Seed of the shard order, the step order in a round and the planned shuffles."""
    eval_batch_size: int = 8
    """Samples per batch of validation and evaluation, in order, in every mode."""
    policy: Policy = field(default_factory=OnlinePolicy)
    """The mode's own knobs and its plan (``batching.policy.*``)."""
    rows: RowLayout = field(default_factory=PaddedRows)
    """The row layout (:mod:`~odb_lightning.core.rows`): its cost and the patch budget
    (``batching.rows.*``)."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """The loader's processes (``batching.loader.*``)."""

    def __post_init__(self) -> None:
        budget = self.token_budget
        if budget != TOKEN_BUDGET_AUTO and (not is_int(budget) or budget < 1):  # type: ignore[operator]
            raise ValueError(
                f"{GROUP}.token_budget must be a positive integer or auto, got {budget!r}"
            )
        check_int(f"{GROUP}.seed", self.seed)
        check_positive_int(f"{GROUP}.eval_batch_size", self.eval_batch_size)
        for name, kind in (("policy", Policy), ("rows", RowLayout), ("loader", LoaderConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(
                    f"{GROUP}.{name} must be a {kind.__name__}, got {getattr(self, name)!r}"
                )
        mode_of(self.policy, self.rows)  # refuses a policy and layout no mode pairs

    @property
    def mode(self) -> str:
        """The registered mode of the policy and the row layout (``odb``, ``oracle``...)."""
        return mode_of(self.policy, self.rows).name

    @property
    def budget(self) -> Budget:
        """The row layout's cost under ``token_budget`` (an integer by then)."""
        if self.token_budget == TOKEN_BUDGET_AUTO:
            raise ValueError(
                f"{GROUP}.token_budget=auto is resolved at fit start on a CUDA device "
                "(odb_lightning.lit.memory.warmup.MemoryWarmup, in the default callbacks); "
                "without it, set an integer"
            )
        return self.rows.budget(self.token_budget)  # type: ignore[arg-type]

    @property
    def patch_budget(self) -> PatchBudget | None:
        """The vision-tower bound of a group, or ``None`` without ``max_patches``."""
        return self.rows.patch_budget

    def handshake(self) -> list[int]:
        """The settings every rank must share, as integers
        (:func:`~odb_lightning.core.handshake.settings_message`)."""
        return settings_message(self)

    def knob(self, name: str) -> Any:
        """The value of the knob ``name`` (``mode``, a top field, or a field of a concern);
        ``None`` when this mode's policy or layout has no such field."""
        if name not in KNOB_NAMES:
            raise KeyError(f"unknown batching setting {name!r}")
        if name == "mode":
            return self.mode
        for holder in (self, self.policy, self.rows, self.loader):
            if name in _field_names(type(holder)):
                return getattr(holder, name)
        return None

    @classmethod
    def of(cls, base: BatchingConfig | None = None, /, **knobs: Any) -> BatchingConfig:
        """``base`` (default: the defaults) with ``knobs`` replaced, each by its flat name.

        A knob goes to the concern whose dataclass has that field (names are unique
        across concerns): ``BatchingConfig.of(mode="oracle", token_budget=8192,
        max_batch_size=64, num_workers=0)``. ``mode`` switches the policy and layout
        types, keeping the values of the fields both types have. A knob of another mode's
        policy or layout is not read, so one set of knobs serves every mode.

        Raises:
            TypeError: A name that is no knob of any concern (a typo).
        """
        unknown = sorted(set(knobs) - KNOB_NAMES)
        if unknown:
            raise TypeError(f"unknown batching settings {unknown}; knobs: {sorted(KNOB_NAMES)}")
        base = cls() if base is None else base
        if not knobs:
            return base
        mode = mode_named(knobs.pop("mode")) if "mode" in knobs else base._mode_entry()
        policy = _rebuilt(mode.policy, base.policy, knobs)
        rows = _rebuilt(mode.rows, base.rows, knobs)
        loader = _rebuilt(LoaderConfig, base.loader, knobs)
        own = {name: knobs.pop(name) for name in _OWN_FIELDS if name in knobs}
        # What is left are knobs of other modes' policies or layouts: not read here.
        return replace(base, policy=policy, rows=rows, loader=loader, **own)

    def _mode_entry(self) -> Mode:
        return mode_of(self.policy, self.rows)


def _field_names(kind: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(kind))


def _rebuilt(kind: type, current: Any, knobs: dict[str, Any]) -> Any:
    """``current`` as a ``kind`` with the knobs ``kind`` has (popped from ``knobs``)."""
    names = _field_names(kind)
    given = {name: knobs.pop(name) for name in list(knobs) if name in names}
    if type(current) is kind:
        return replace(current, **given) if given else current
    kept = {name: getattr(current, name) for name in names & _field_names(type(current))}
    return kind(**{**kept, **given})


_CONCERNS = frozenset({"policy", "rows", "loader"})
_OWN_FIELDS = _field_names(BatchingConfig) - _CONCERNS
KNOB_NAMES = frozenset(
    {"mode"}
    | _OWN_FIELDS
    | _field_names(LoaderConfig)
    | {name for mode in MODES.values() for name in _field_names(mode.policy)}
    | {name for mode in MODES.values() for name in _field_names(mode.rows)}
)
"""Every flat knob name the keyword form takes."""
