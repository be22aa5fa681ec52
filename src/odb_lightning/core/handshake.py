"""What every rank of a job must share, and the check that it does: the settings that
change what a round plans, and the data each rank loads.

The channel's one handshake message is :func:`settings_message` (each shared setting as
an integer, in :data:`SHARED_SETTINGS` order) followed by :meth:`DataHandshake.encode`.
A setting is shared by one entry in :data:`SHARED_SETTINGS`, nowhere else.
"""

from __future__ import annotations

import array
import hashlib
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from odb_lightning.core.modes import MODES
from odb_lightning.core.online_policy import EmissionOrder, ShardDealing
from odb_lightning.core.rows import ROW_SETTINGS


class Knobs(Protocol):
    """Reads a knob by its flat name (:meth:`~odb_lightning.core.config.BatchingConfig.knob`)."""

    def knob(self, name: str) -> Any: ...


class SettingsMismatchError(RuntimeError):
    """Ranks of one job were started with different batching settings."""


def _billionths(weight: float) -> int:
    return round(weight * 1e9)


def _tristate(on: bool | None) -> int:
    """``None`` (on where it applies) apart from ``false``: 2, 1, 0."""
    return 2 if on is None else int(on)


SHARED_SETTINGS: dict[str, Callable[[Any], int]] = {
    "token_budget": int,
    "outstanding_depth": int,
    "window_budgets": lambda budgets: budgets or 0,
    "ramp_budgets": lambda budgets: budgets or 0,
    "window_max_mib": lambda mib: 0 if mib is None else round(mib * 1024),  # KiB
    "shard_dealing": lambda dealing: list(ShardDealing).index(dealing),
    "max_steps_per_round": int,
    "emission_order": lambda order: list(EmissionOrder).index(order),
    "join": int,
    "cross_rank_grouping": _tristate,
    "pool_below_sync": _billionths,
    "fetch_aware_dealing": _tristate,
    "seed": int,
    "attention_weight": _billionths,
    "mode": lambda mode: list(MODES).index(mode),
    **ROW_SETTINGS,
}
"""The knobs (by their flat names, :meth:`BatchingConfig.knob`) that change what a round
plans, each with its integer encoding: ranks that differ in one of them would diverge.
The row layouts' entries are theirs (:data:`~odb_lightning.core.rows.ROW_SETTINGS`)."""
_ENCODES_NONE = frozenset({"cross_rank_grouping", "fetch_aware_dealing"})
"""Knobs whose ``None`` is a setting of its own, not an absent field (encoded as such)."""
HANDSHAKE_FIELDS = tuple(SHARED_SETTINGS)
"""The names of the settings part of the handshake message, in order."""


def settings_message(config: Knobs) -> list[int]:
    """The shared settings of ``config`` as integers (weights in 1e-9, MiB in KiB; 0 for a
    knob its mode does not have, such as a planned policy's window)."""
    values = ((name, config.knob(name), encode) for name, encode in SHARED_SETTINGS.items())
    return [
        encode(value) if value is not None or name in _ENCODES_NONE else 0
        for name, value, encode in values
    ]


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


def handshake_message(config: Knobs, data: DataHandshake | None) -> list[int]:
    """The channel's one handshake message: settings, then data (``UNKNOWN`` when
    ``data`` is ``None``); its length is the same on every rank."""
    return settings_message(config) + (data or DataHandshake()).encode()


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
