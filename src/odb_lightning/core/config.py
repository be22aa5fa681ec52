"""The batching configuration: every knob of batching and of the loader, defined once.

Hydra builds :class:`BatchingConfig` from the ``batching`` group (YAML keys equal the
field names); :class:`~odb_lightning.runtime.loader.ODBLoader`, the planned loader,
:func:`~odb_lightning.core.planners.plan_epoch` and
:func:`~odb_lightning.core.simulate.simulate` take it whole. A new knob is a field here,
validated in ``__post_init__``, and nowhere else.
"""

from __future__ import annotations

import array
import hashlib
import math
import multiprocessing
import operator
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from enum import Enum, StrEnum
from typing import Any, TypeVar

from odb_lightning.core.budget import Budget
from odb_lightning.core.patch_budget import PatchBudget

GROUP = "batching"
"""The Hydra config group of :class:`BatchingConfig`: every message names ``batching.<field>``."""


TOKEN_BUDGET_AUTO = "auto"
"""``batching.token_budget=auto``: found at fit start on the GPU (``lit/memory.py``)."""


class BatchingMode(StrEnum):
    """How an epoch is cut into batches (see the README's table of modes)."""

    STANDARD = "standard"
    SORTED = "sorted"
    BUCKETED = "bucketed"
    ORACLE = "oracle"
    ODB = "odb"
    ODB_PACKED = "odb_packed"


ONLINE_MODES = frozenset({BatchingMode.ODB, BatchingMode.ODB_PACKED})
"""Modes the online runtime forms (no epoch plan up front)."""
LENGTH_PASS_MODES = frozenset({BatchingMode.SORTED, BatchingMode.BUCKETED, BatchingMode.ORACLE})
"""Modes that need every sample's exact length before the epoch (a length cache)."""
FIXED_SIZE_MODES = frozenset({BatchingMode.STANDARD, BatchingMode.SORTED})
"""Modes that cut batches of ``batch_size`` samples and ignore ``token_budget``."""


class OnBadSample(StrEnum):
    """What a sample that fails validation does: stop naming it, or be skipped and counted."""

    RAISE = "raise"
    SKIP = "skip"


class StartMethod(StrEnum):
    """``multiprocessing`` start method of the loader's worker and collate processes."""

    FORK = "fork"
    SPAWN = "spawn"
    FORKSERVER = "forkserver"


class PackedAttention(StrEnum):
    """How the model attends inside a packed row, which sets the row's attention cost."""

    VARLEN = "varlen"
    """Blocks across samples are skipped (flash-attention varlen, flex attention)."""
    DENSE = "dense"
    """A dense block mask computes the whole ``N x N`` square (sdpa, eager)."""


def packed_attention_of(attn_implementation: str) -> PackedAttention:
    """The packed-row attention cost of a ``transformers`` attention backend: ``sdpa`` and
    ``eager`` get a dense block mask, every other backend (flash, flex, hub kernels) skips
    the blocks across samples."""
    dense = attn_implementation in ("sdpa", "eager")
    return PackedAttention.DENSE if dense else PackedAttention.VARLEN


class ShardDealing(StrEnum):
    """How an epoch's samples reach the ranks' windows."""

    FIXED = "fixed"
    """Each rank owns a fixed shard (every ``W``-th index of the seeded order, or ``shard=``)."""
    BY_NEED = "by_need"
    """One seeded global order, dealt in every round to the ranks whose windows need work."""


class SettingsMismatchError(RuntimeError):
    """Ranks of one job were started with different batching settings."""


EnumT = TypeVar("EnumT", bound=Enum)


def _key(name: str) -> str:
    return f"{GROUP}.{name}"


def _enum(kind: type[EnumT], name: str, value: object) -> EnumT:
    """``value`` (a member, its value, or a member of another Enum with the same values)
    as a member of ``kind``."""
    try:
        return kind(value.value if isinstance(value, Enum) else value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ValueError(f"{_key(name)} must be one of {allowed}, got {value!r}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{_key(name)} must be a positive integer, got {value!r}")


def _seconds(name: str, value: object) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):  # type: ignore[arg-type]
        raise ValueError(f"{_key(name)} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How batches are formed and how the loader runs. Errors name the Hydra key.

    Attributes:
        mode: ``standard``, ``sorted``, ``bucketed``, ``oracle``, ``odb`` or ``odb_packed``.
        token_budget: ``L_max``: most padded tokens per step (real tokens when packed);
            ``auto``: the largest budget whose worst-case step fits the GPU, measured at
            fit start (:class:`~odb_lightning.lit.memory.MemoryWarmup`).
        outstanding_depth: ODB window cap ``D``: most samples buffered or in flight per
            rank (the whole window when ``window_budgets`` is ``None``).
        window_budgets: ODB window sized in work: it fills until its samples' row costs
            sum to this many ``token_budget``s (about as many full batches), within
            ``outstanding_depth`` samples; ``None``: the window is ``D`` samples.
        window_max_mib: Most MiB of serialized samples the window sized in work holds
            (meant for image-heavy samples); ``None``: no cap. Text at the defaults holds
            about 32 MiB (16.2 bytes per ShareGPT token, experiments/sync_efficiency). The
            emitted steps waiting to be collated (at most one round's) and the queued
            batches come on top.
        shard_dealing: ``by_need``: one seeded global order dealt each round to the
            windows that lack work, levelling the ranks' work so they finish together
            (a loader takes the order as ``order=``); ``fixed``: each rank owns a shard
            (every ``W``-th index, or ``shard=``).
        max_steps_per_round: ``Q``: most steps one alignment round emits per rank (as
            many as the window holds budgets: a round may drain it, and each sample is
            grouped about once).
        join: Every sample once per epoch (IDLE steps for finished ranks), or end the
            epoch at the first finished rank and count the rest as dropped.
        seed: Seed of the shard order, the step order in a round and the planned shuffles.
        attention_weight: Weight ``w`` of the quadratic attention term of the budget.
        pad_to_multiple_of: Pad every row (every packed row) to a multiple of this many
            tokens; the budget charges the rounded length (1: no rounding).
        packed_attention: ``varlen`` or ``dense``: the attention cost of a packed row
            (``w * sum L_i**2`` or ``w * N**2``); the presets derive it from
            ``model.attn_implementation``.
        max_patches: Most ViT patch cost of one group of image-text samples (the vision
            tower's work, :mod:`~odb_lightning.core.patch_budget`); ``None``: no bound.
        patch_attention_weight: Weight ``w_p`` of the per-image quadratic term of the
            patch cost (``p + w_p * p**2`` per image of ``p`` patches).
        batch_size: Samples per batch of ``standard`` and ``sorted`` (and of validation).
        max_batch_size: Cap on samples per batch (``bucketed``, ``oracle``).
        boundaries: Bucket edges of ``bucketed``; empty: optimized on the cached lengths.
        num_buckets: Buckets to optimize when ``boundaries`` is empty.
        num_workers: Loader worker processes per rank (0: everything in the main process).
        on_bad_sample: ``raise`` (error naming the sample and field) or ``skip`` (count it).
        timeout_s: Most seconds without a sample arriving from the workers.
        alignment_timeout_s: Most seconds for connecting the metadata channel and for one
            round's all-gather (keep it >= ``timeout_s``: peers wait while a rank waits).
        persistent_workers: Keep the loader processes (and the channel) across epochs.
        pin_memory: Put every batch in page-locked host memory when CUDA is available
            (asynchronous host-to-device copies); ignored without CUDA.
        multiprocessing_context: ``fork``, ``spawn``, ``forkserver`` or ``None`` (default).
    """

    mode: BatchingMode = BatchingMode.ODB
    token_budget: int | str = 16384
    outstanding_depth: int = 8192
    window_budgets: int | None = 128
    window_max_mib: float | None = 1024.0
    shard_dealing: ShardDealing = ShardDealing.BY_NEED
    max_steps_per_round: int = 128
    join: bool = True
    seed: int = 0
    attention_weight: float = 0.0
    pad_to_multiple_of: int = 1
    packed_attention: PackedAttention = PackedAttention.VARLEN
    max_patches: int | None = None
    patch_attention_weight: float = 0.0
    batch_size: int = 8
    max_batch_size: int | None = None
    boundaries: tuple[int, ...] = ()
    num_buckets: int = 6
    num_workers: int = 2
    on_bad_sample: OnBadSample = OnBadSample.RAISE
    timeout_s: float = 60.0
    alignment_timeout_s: float = 60.0
    persistent_workers: bool = False
    pin_memory: bool = True
    multiprocessing_context: StartMethod | None = None

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "mode", _enum(BatchingMode, "mode", self.mode))
        set_field(self, "on_bad_sample", _enum(OnBadSample, "on_bad_sample", self.on_bad_sample))
        set_field(self, "shard_dealing", _enum(ShardDealing, "shard_dealing", self.shard_dealing))
        set_field(
            self,
            "packed_attention",
            _enum(PackedAttention, "packed_attention", self.packed_attention),
        )
        budget = self.token_budget
        if budget != TOKEN_BUDGET_AUTO and (not _is_int(budget) or budget < 1):
            raise ValueError(
                f"{_key('token_budget')} must be a positive integer or auto, got {budget!r}"
            )
        for name in (
            "outstanding_depth",
            "max_steps_per_round",
            "batch_size",
            "pad_to_multiple_of",
        ):
            _positive_int(name, getattr(self, name))
        _positive_int("num_buckets", self.num_buckets)
        if self.max_batch_size is not None:
            _positive_int("max_batch_size", self.max_batch_size)
        if self.window_budgets is not None:
            _positive_int("window_budgets", self.window_budgets)
        mib = self.window_max_mib
        if mib is not None and not (_is_number(mib) and math.isfinite(mib) and mib > 0):
            raise ValueError(
                f"{_key('window_max_mib')} must be a positive number of MiB or null, got {mib!r}"
            )
        if self.max_patches is not None:
            _positive_int("max_patches", self.max_patches)
        patch_weight = self.patch_attention_weight
        if not (_is_number(patch_weight) and math.isfinite(patch_weight) and patch_weight >= 0):
            raise ValueError(
                f"{_key('patch_attention_weight')} must be finite and >= 0, got {patch_weight!r}"
            )
        if not _is_int(self.num_workers) or self.num_workers < 0:
            raise ValueError(
                f"{_key('num_workers')} must be an integer >= 0, got {self.num_workers!r}"
            )
        if not _is_int(self.seed):
            raise ValueError(f"{_key('seed')} must be an integer, got {self.seed!r}")
        for name in ("join", "persistent_workers", "pin_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{_key(name)} must be a bool, got {getattr(self, name)!r}")
        weight = self.attention_weight
        if not (isinstance(weight, int | float) and not isinstance(weight, bool)) or not (
            math.isfinite(weight) and weight >= 0
        ):
            raise ValueError(f"{_key('attention_weight')} must be finite and >= 0, got {weight!r}")
        _seconds("timeout_s", self.timeout_s)
        _seconds("alignment_timeout_s", self.alignment_timeout_s)
        self._check_boundaries()
        self._check_start_method()

    def _check_boundaries(self) -> None:
        edges = tuple(self.boundaries)
        if not all(_is_int(edge) and edge >= 0 for edge in edges):
            raise ValueError(
                f"{_key('boundaries')} must be non-negative integers, got {list(edges)}"
            )
        if any(b >= c for b, c in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"{_key('boundaries')} must be strictly increasing, got {list(edges)}")
        object.__setattr__(self, "boundaries", edges)

    def _check_start_method(self) -> None:
        if self.multiprocessing_context is None:
            return
        method = _enum(StartMethod, "multiprocessing_context", self.multiprocessing_context)
        if method.value not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"{_key('multiprocessing_context')} {method.value!r} is not available here"
            )
        object.__setattr__(self, "multiprocessing_context", method)

    @property
    def packed(self) -> bool:
        """Groups are emitted padding-free (``odb_packed``): the budget counts real tokens."""
        return self.mode is BatchingMode.ODB_PACKED

    @property
    def budget(self) -> Budget:
        if self.token_budget == TOKEN_BUDGET_AUTO:
            raise ValueError(
                f"{_key('token_budget')}=auto is resolved at fit start on a CUDA device "
                "(odb_lightning.lit.memory.MemoryWarmup, in the default callbacks); "
                "without it, set an integer"
            )
        return Budget(
            self.token_budget,
            self.attention_weight,
            pad_to_multiple_of=self.pad_to_multiple_of,
            dense_packed_attention=self.packed and self.packed_attention is PackedAttention.DENSE,
        )

    @property
    def patch_budget(self) -> PatchBudget | None:
        """The vision-tower bound of a group, or ``None`` without ``max_patches``."""
        if self.max_patches is None:
            return None
        return PatchBudget(self.max_patches, self.patch_attention_weight)

    @property
    def window_max_bytes(self) -> int | None:
        """``window_max_mib`` in bytes (``None``: no cap)."""
        return None if self.window_max_mib is None else int(self.window_max_mib * 2**20)

    def handshake(self) -> list[int]:
        """The knobs every rank must share, as integers (``attention_weight`` in 1e-9)."""
        return [_HANDSHAKE_ENCODE[name](getattr(self, name)) for name in HANDSHAKE_FIELDS]


HANDSHAKE_FIELDS = (
    "token_budget",
    "outstanding_depth",
    "window_budgets",
    "window_max_mib",
    "shard_dealing",
    "max_steps_per_round",
    "join",
    "seed",
    "attention_weight",
    "mode",
    "pad_to_multiple_of",
    "packed_attention",
    "max_patches",
    "patch_attention_weight",
)
"""Fields that change what a round plans: ranks that differ in one of them would diverge."""
_HANDSHAKE_ENCODE: dict[str, Any] = {
    "token_budget": int,
    "outstanding_depth": int,
    "window_budgets": lambda budgets: budgets or 0,
    "window_max_mib": lambda mib: 0 if mib is None else round(mib * 1024),  # KiB
    "shard_dealing": lambda dealing: list(ShardDealing).index(dealing),
    "max_steps_per_round": int,
    "join": int,
    "seed": int,
    "attention_weight": lambda weight: round(weight * 1e9),
    "mode": lambda mode: list(BatchingMode).index(mode),
    "pad_to_multiple_of": int,
    "packed_attention": lambda kind: list(PackedAttention).index(kind),
    "max_patches": lambda patches: patches or 0,
    "patch_attention_weight": lambda weight: round(weight * 1e9),
}


def check_settings_agree(messages: list[list[int]]) -> None:
    """Raise naming the first field on which the ranks' handshake messages differ.

    Only the first ``len(HANDSHAKE_FIELDS)`` integers of each message are read: the
    channel's handshake appends a :class:`DataHandshake` (see :func:`check_data_agree`).
    """
    for column, name in enumerate(HANDSHAKE_FIELDS):
        values = [message[column] for message in messages]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise SettingsMismatchError(
                f"ranks disagree on loader setting '{name}' ({per_rank}); "
                "every rank must be started with the same loader settings"
            )


UNKNOWN = -1
"""A :class:`DataHandshake` integer a rank does not know (never compared)."""
_DEFAULT_SHARD, _USER_SHARD, _USER_ORDER = 0, 1, 2
_SHARD_KIND = {_DEFAULT_SHARD: "default", _USER_SHARD: "shard=", _USER_ORDER: "order="}
_PRIME = (1 << 61) - 1
_WEIGHTS = (0x1D2C3B4A5968778, 0x0F1E2D3C4B5A697, 0x123456789ABCDEF)  # fixed, arbitrary


def _digest_of_sums(s1: int, s2: int, s3: int) -> int:
    return (_WEIGHTS[0] * s1 + _WEIGHTS[1] * s2 + _WEIGHTS[2] * s3) % _PRIME


def shard_digest(ids: Iterable[int]) -> int:
    """Order-free digest of dataset indices: a fixed random combination of their first
    three power sums, modulo the prime ``2**61 - 1``. Digests of shards add up (mod the
    prime) to the digest of their union, so shards whose sizes sum to ``n`` are a
    partition of ``range(n)`` when their digests sum to :func:`range_digest` ``(n)``; a
    duplicated index with another missing changes the sum unless the pair solves one
    fixed cubic, which accidents practically never do. A few tenths of a second per
    million ids (once per channel)."""
    ids = list(map(int, ids))  # numpy or tensor scalars would overflow the cubes
    squares = list(map(operator.mul, ids, ids))
    return _digest_of_sums(sum(ids), sum(squares), sum(map(operator.mul, ids, squares)))


def order_digest(ids: Iterable[int]) -> int:
    """Digest of a sequence of dataset indices that depends on their order: a BLAKE2 hash
    of the int64 values, cut to 60 bits (ranks dealt by need must walk the same order)."""
    data = array.array("q", map(int, ids)).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 4


def range_digest(n: int) -> int:
    """:func:`shard_digest` of ``range(n)``, in closed form."""
    s1 = n * (n - 1) // 2
    return _digest_of_sums(s1, (n - 1) * n * (2 * n - 1) // 6, s1 * s1)


@dataclass(frozen=True)
class DataHandshake:
    """What every rank must agree on about its data, appended to the settings handshake.

    Attributes:
        dataset_len: ``len(dataset)`` (``UNKNOWN``: not known where the channel opens).
        max_seq_len: The loader's ``max_seq_len`` (``None``: no limit).
        user_shard: ``shard=`` gives the indices (else the default seeded sharding, a
            partition of ``range(dataset_len)`` when the lengths and seeds agree).
        epoch: The epoch the shard below belongs to.
        shard_size: ``len(shard(epoch))`` with ``user_shard``, else ``UNKNOWN``.
        shard_digest: :func:`shard_digest` of ``shard(epoch)`` with ``user_shard``
            (:func:`order_digest` of ``order(epoch)`` with ``user_order``).
        user_order: The indices are ``order(epoch)``, the epoch's global order dealt by
            need, the same on every rank (else this rank's ``shard(epoch)``).
    """

    dataset_len: int = UNKNOWN
    max_seq_len: int | None = None
    user_shard: bool | None = None
    epoch: int = UNKNOWN
    shard_size: int = UNKNOWN
    shard_digest: int = 0
    user_order: bool = False

    @classmethod
    def of(
        cls,
        dataset_len: int,
        max_seq_len: int | None,
        epoch: int,
        shard: list[int] | None,
        *,
        order: bool = False,
    ) -> DataHandshake:
        """The handshake of a loader; ``shard``: this rank's ``shard(epoch)`` (``order``:
        the epoch's global ``order(epoch)``), or ``None`` for the default sharding."""
        if shard is None:
            return cls(dataset_len, max_seq_len, user_shard=False, epoch=epoch)
        digest = order_digest(shard) if order else shard_digest(shard)
        return cls(dataset_len, max_seq_len, True, epoch, len(shard), digest, user_order=order)

    def encode(self) -> list[int]:
        """Exactly ``len(DATA_HANDSHAKE_FIELDS)`` integers (``max_seq_len`` ``None``: 0)."""
        kind = UNKNOWN if self.user_shard is None else int(self.user_shard)
        if self.user_shard and self.user_order:
            kind = _USER_ORDER
        max_seq_len = UNKNOWN if self.dataset_len == UNKNOWN else (self.max_seq_len or 0)
        return [
            self.dataset_len,
            max_seq_len,
            kind,
            self.epoch,
            self.shard_size,
            self.shard_digest,
        ]


DATA_HANDSHAKE_FIELDS = ("len(dataset)", "max_seq_len", "sharding", "epoch", "size", "digest")
"""The integers of :meth:`DataHandshake.encode`, after the ``HANDSHAKE_FIELDS``."""


def handshake_message(config: BatchingConfig, data: DataHandshake | None) -> list[int]:
    """The channel's one handshake message: settings, then data (``UNKNOWN`` when
    ``data`` is ``None``); its length is the same on every rank."""
    return config.handshake() + (data or DataHandshake()).encode()


def _disagree(name: str, values: list[Any], hint: str) -> SettingsMismatchError:
    per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
    return SettingsMismatchError(f"ranks disagree on {name}: {per_rank}; {hint}")


def check_data_agree(messages: list[list[int]]) -> None:
    """Raise naming the field when the ranks' :class:`DataHandshake` parts disagree, when
    their ``shard=`` indices provably overlap (see :func:`shard_digest`), or when their
    ``order=`` orders differ in size or in order (see :func:`order_digest`).

    Ranks that sent ``UNKNOWN`` for a field are left out of its comparison. With
    ``shard=`` the check is exact when the shard sizes sum to ``len(dataset)`` or more;
    shards that cover only part of the dataset are not checked for overlap.
    """
    start = len(HANDSHAKE_FIELDS)
    rows = [dict(zip(DATA_HANDSHAKE_FIELDS, m[start:], strict=True)) for m in messages]
    known = [row for row in rows if row["len(dataset)"] != UNKNOWN]
    for name, hint in (
        ("len(dataset)", "every rank must load the same dataset (shards are cut from it)"),
        ("max_seq_len", "every rank must give ODBLoader the same max_seq_len (0: None)"),
    ):
        values = [row[name] for row in known]
        if len(set(values)) > 1:
            raise _disagree(name, [row[name] for row in rows], hint)
    kinds = [row["sharding"] for row in rows if row["sharding"] != UNKNOWN]
    if len(set(kinds)) > 1:
        shown = [_SHARD_KIND.get(row["sharding"], "unknown") for row in rows]
        raise _disagree("sharding", shown, "give shard= (or order=) on every rank or on none")
    if kinds and kinds[0] == _USER_ORDER:
        for name in ("size", "digest"):
            if len({row[name] for row in rows if row["sharding"] == _USER_ORDER}) > 1:
                raise _disagree(
                    f"the order= indices ({name})",
                    [row[name] for row in rows],
                    "dealt by need, every rank must give the same order(epoch)",
                )
        return
    if not kinds or kinds[0] != _USER_SHARD or len(kinds) != len(rows):
        return
    _check_shards_partition(rows)


def _check_shards_partition(rows: list[dict[str, int]]) -> None:
    n, epoch = rows[0]["len(dataset)"], rows[0]["epoch"]
    sizes = [row["size"] for row in rows]
    per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(sizes))
    where = f"the shard= indices of the ranks overlap in epoch {epoch}: shard sizes ({per_rank})"
    if sum(sizes) > n:
        raise SettingsMismatchError(
            f"{where} sum to {sum(sizes)}, more than len(dataset) {n}, so some index is "
            "on two ranks; every index must belong to at most one rank"
        )
    if sum(sizes) == n and sum(row["digest"] for row in rows) % _PRIME != range_digest(n):
        raise SettingsMismatchError(
            f"{where} sum to len(dataset) {n} but the shards are not a partition of "
            f"range({n}): some index is on two ranks (or outside the dataset) and "
            "another on none"
        )


FIELD_NAMES = frozenset(f.name for f in fields(BatchingConfig))


def resolve_config(config: BatchingConfig | None, knobs: dict[str, Any]) -> BatchingConfig:
    """``config`` with ``knobs`` (field names) replaced, or a new config of ``knobs``.

    The keyword form of the loaders, the planner and the simulator: knobs keep their
    field names, so nothing is re-spelled.
    """
    unknown = sorted(set(knobs) - FIELD_NAMES)
    if unknown:
        raise TypeError(f"unknown batching settings {unknown}; fields: {sorted(FIELD_NAMES)}")
    if config is None:
        return BatchingConfig(**knobs)
    return replace(config, **knobs) if knobs else config
