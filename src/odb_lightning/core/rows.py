"""The row layouts: how a group of samples becomes rows of a batch, and what that costs.

A layout owns the row cost (the :class:`~odb_lightning.core.budget.Budget` it builds), the
rule that cuts a window into groups, and the vision-tower bound of a group; the runtime
picks its collate by the layout's type and the model reads the batch itself. Other code
asks the layout instead of testing which one it is.

- :class:`PaddedRows`: one right-padded row per sample, a group costs ``g x row_cost(L)``.
- :class:`PackedRows`: one padding-free row per group (position ids restart per sample,
  attention stays inside each sample); the budget counts real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from odb_lightning.core.budget import Budget, PackedBudget
from odb_lightning.core.checks import check_positive_int, check_weight, enum_member
from odb_lightning.core.patch_budget import PatchBudget

ROWS_KEY = "batching.rows"
"""The Hydra key of the row layout: every message names ``batching.rows.<field>``."""


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


@dataclass(frozen=True)
class RowLayout:
    """What every layout shares: rounding, the attention term and the patch budget."""

    pad_to_multiple_of: int = 1
    """Pad every row to a multiple of this many tokens; the budget charges the rounded
    length (8 or 64 suit tensor cores; 1: no rounding)."""
    attention_weight: float = 0.0
    """Weight ``w`` of the quadratic attention term of the budget (0: tokens only)."""
    max_patches: int | None = None
    """Most ViT patch cost of one group of image-text samples (the vision tower's work,
    :mod:`~odb_lightning.core.patch_budget`); ``None``: no bound."""
    patch_attention_weight: float = 0.0
    """Weight ``w_p`` of the per-image quadratic term of the patch cost (``p + w_p * p**2``
    per image of ``p`` patches)."""

    packs: ClassVar[bool] = False
    """A group is one padding-free row (its samples' tokens, one after the other)."""

    def __post_init__(self) -> None:
        check_positive_int(f"{ROWS_KEY}.pad_to_multiple_of", self.pad_to_multiple_of)
        check_weight(f"{ROWS_KEY}.attention_weight", self.attention_weight)
        check_positive_int(f"{ROWS_KEY}.max_patches", self.max_patches, optional=True)
        check_weight(f"{ROWS_KEY}.patch_attention_weight", self.patch_attention_weight)

    def budget(self, token_budget: int) -> Budget:
        """The row cost of this layout under ``token_budget``."""
        return Budget(
            token_budget, self.attention_weight, pad_to_multiple_of=self.pad_to_multiple_of
        )

    def padded_tokens(self, lengths: Sequence[int]) -> int:
        """Tokens the collate makes of a group of these lengths: every row padded to the
        longest, rounded up to ``pad_to_multiple_of`` (0 for an IDLE step's none)."""
        return len(lengths) * self._rounded(max(lengths)) if lengths else 0

    def _rounded(self, length: int) -> int:
        return -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of

    def attention_mismatch(self, attn_implementation: str) -> str | None:
        """Why this layout's attention cost is not what ``attn_implementation`` runs, or
        ``None`` (padded rows attend within each row: any backend)."""
        return None

    @property
    def patch_budget(self) -> PatchBudget | None:
        """The vision-tower bound of a group, or ``None`` without ``max_patches``."""
        if self.max_patches is None:
            return None
        return PatchBudget(self.max_patches, self.patch_attention_weight)


@dataclass(frozen=True)
class PaddedRows(RowLayout):
    """One right-padded row per sample (``pad_collate``); groups are cut by the padded
    cost ``g x row_cost(L)`` of their longest sample."""


@dataclass(frozen=True)
class PackedRows(RowLayout):
    """One padding-free row per group (``pack_collate``); groups are cut greedily under
    the packed row's cost."""

    packed_attention: PackedAttention = PackedAttention.VARLEN
    """``varlen`` or ``dense``: the attention cost of a packed row (``w * sum L_i**2`` or
    ``w * N**2``); checked against ``model.architecture.attn_implementation`` at start."""

    packs: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        kind = enum_member(PackedAttention, f"{ROWS_KEY}.packed_attention", self.packed_attention)
        object.__setattr__(self, "packed_attention", kind)

    def budget(self, token_budget: int) -> Budget:
        return PackedBudget(
            token_budget,
            self.attention_weight,
            pad_to_multiple_of=self.pad_to_multiple_of,
            dense_packed_attention=self.packed_attention is PackedAttention.DENSE,
        )

    def padded_tokens(self, lengths: Sequence[int]) -> int:
        return self._rounded(sum(lengths)) if lengths else 0

    def attention_mismatch(self, attn_implementation: str) -> str | None:
        """With ``attention_weight > 0`` a packed row's cost depends on the kernel:
        ``packed_attention`` must be the one the backend runs."""
        expected = packed_attention_of(attn_implementation)
        if not self.attention_weight or self.packed_attention is expected:
            return None
        return (
            f"{ROWS_KEY}.packed_attention must be {expected.value} with "
            f"model.architecture.attn_implementation={attn_implementation} and "
            f"{ROWS_KEY}.attention_weight={self.attention_weight}: sdpa and eager attend over "
            "a dense block mask (N^2 per packed row), flash and flex attention skip the "
            "blocks across samples (sum of L_i^2)"
        )
