"""Settings that every rank of one ODB job must share, and their handshake check."""

from __future__ import annotations

from dataclasses import dataclass, fields

from odb_lightning.core.budget import Budget


class SettingsMismatchError(RuntimeError):
    """Ranks of one job were started with different loader settings."""


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """Loader settings that must agree across ranks.

    Attributes:
        token_budget: Maximum padded tokens per step (``L_max``).
        outstanding_depth: Samples in flight per rank, also the grouping window ``D``.
        max_steps_per_round: Most steps one alignment round may emit per rank; the
            runtime keeps this many output slots free before it joins a round.
        join: Join mode (exactly-once coverage) or non-join (shortest-rank closure).
        seed: Seed of the shard order and of the step order inside a round.
        attention_weight: Quadratic attention term of the budget (0 = plain padding).
        packed: Groups are emitted padding-free (one row per group), so the budget counts
            real tokens: a group fits while the sum of its lengths does.
    """

    token_budget: int
    outstanding_depth: int
    max_steps_per_round: int = 8
    join: bool = True
    seed: int = 0
    attention_weight: float = 0.0
    packed: bool = False

    def __post_init__(self) -> None:
        for name in ("token_budget", "outstanding_depth", "max_steps_per_round"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        Budget(self.token_budget, self.attention_weight)  # validates the budget fields

    @property
    def budget(self) -> Budget:
        return Budget(self.token_budget, self.attention_weight)

    def encode(self) -> list[int]:
        """Fixed-size integer form for the handshake (``attention_weight`` in 1e-9 units)."""
        return [
            self.token_budget,
            self.outstanding_depth,
            self.max_steps_per_round,
            int(self.join),
            self.seed,
            round(self.attention_weight * 1e9),
            int(self.packed),
        ]


SETTINGS_FIELDS = tuple(f.name for f in fields(LoaderSettings))


def check_settings_agree(messages: list[list[int]]) -> None:
    """Raise naming the first field on which the ranks' handshake messages differ."""
    for column, name in enumerate(SETTINGS_FIELDS):
        values = [message[column] for message in messages]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise SettingsMismatchError(
                f"ranks disagree on loader setting '{name}' ({per_rank}); "
                "every rank must be started with the same loader settings"
            )
