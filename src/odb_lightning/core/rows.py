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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar

from odb_lightning.core.budget import Budget
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


@dataclass(frozen=True, slots=True)
class PackedBudget(Budget):
    """The budget of packed rows: one padding-free row per group (see :class:`PackedRows`).

    Attributes:
        dense_packed_attention: The kernel computes the row's whole ``N x N`` square.
    """

    dense_packed_attention: bool = False

    balances_padding: ClassVar[bool] = False

    def packed_cost(self, total: int, sum_of_squares: int) -> float:
        """Cost of one packed row of ``total`` real tokens whose samples' squared lengths
        sum to ``sum_of_squares`` (see :class:`PackedRows`)."""
        row = self.padded_length(total)
        square = row * row if self.dense_packed_attention else sum_of_squares
        return row + self.attention_weight * square

    def group_cost(self, lengths: Sequence[int]) -> float:
        return self.packed_cost(sum(lengths), sum(n * n for n in lengths))

    def aggregate_cost(self, size: int, longest: int, total: int, sum_of_squares: int) -> float:
        return self.packed_cost(total, sum_of_squares)

    def fits_group(self, size: int, longest: int, total: int, sum_of_squares: int) -> bool:
        return self.packed_cost(total, sum_of_squares) <= self.token_budget


@dataclass(frozen=True, slots=True)
class StepShape:
    """One memory warm-up batch: ``rows`` rows of ``tokens`` tokens; ``one_row``: the
    tokens of several samples one after the other in a single row; ``image_grid``: every
    row starts with one image of this ``(t, h, w)`` patch grid (image-text runs)."""

    name: str
    rows: int
    tokens: int
    one_row: bool = False
    image_grid: tuple[int, int, int] | None = None

    @property
    def total_tokens(self) -> int:
        return self.rows * self.tokens


@dataclass(frozen=True)
class RowLayout:
    """What every layout shares: rounding, the attention term and the patch budget."""

    pad_to_multiple_of: int = 1
    """Pad every row to a multiple of this many tokens; the budget charges the rounded
    length (8 or 64 suit tensor cores; 1: no rounding)."""
    attention_weight: float | None = None
    """Weight ``w`` of the quadratic attention term of the budget. ``None`` (the default):
    the model's own, ``layers x width / matmul parameters``, with which a row costs its
    training FLOPs in token units (:mod:`~odb_lightning.core.flops`); a run resolves it
    from the model it builds (:meth:`with_model_cost`), and where no model is known
    (``odb-plan``, the simulator) it counts as 0. A number overrides it (0: tokens only)."""
    max_patches: int | None = None
    """Most ViT patch cost of one group of image-text samples (the vision tower's work,
    :mod:`~odb_lightning.core.patch_budget`); ``None``: no bound."""
    patch_attention_weight: float = 0.0
    """Weight ``w_p`` of the per-image quadratic term of the patch cost (``p + w_p * p**2``
    per image of ``p`` patches)."""

    def __post_init__(self) -> None:
        check_positive_int(f"{ROWS_KEY}.pad_to_multiple_of", self.pad_to_multiple_of)
        if self.attention_weight is not None:
            check_weight(f"{ROWS_KEY}.attention_weight", self.attention_weight)
        check_positive_int(f"{ROWS_KEY}.max_patches", self.max_patches, optional=True)
        check_weight(f"{ROWS_KEY}.patch_attention_weight", self.patch_attention_weight)

    def budget(self, token_budget: int) -> Budget:
        """The row cost of this layout under ``token_budget``."""
        return Budget(
            token_budget, self.attention_weight or 0.0, pad_to_multiple_of=self.pad_to_multiple_of
        )

    def with_model_cost(self, weight: float, attn_implementation: str) -> RowLayout:
        """This layout with the model's attention ``weight`` where it sets none of its own
        (``attention_weight`` ``None``); padded rows attend within each row whatever the
        backend ``attn_implementation``."""
        if self.attention_weight is not None:
            return self
        return replace(self, attention_weight=weight)

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

    def worst_case_shapes(
        self,
        budget: Budget,
        max_seq_len: int,
        batch_cap: int | None,
        lengths: LengthRange | None = None,
    ) -> list[StepShape]:
        """The largest steps of this layout under ``budget``: one sample of
        ``max_seq_len`` tokens (the longest row and its attention), a full group of them,
        and the largest group of the shortest samples (most rows, at most ``batch_cap``).

        ``lengths``: the shortest and longest training sample where a length pass measured
        them (the planned modes): the same bound at the lengths the run has, which every
        batch its plans form, in any epoch, stays within."""
        low, high, what = _extremes(max_seq_len, lengths)
        cap = batch_cap if batch_cap is not None else budget.token_budget

        def rows_of(length: int) -> int:  # the most rows of this length a group holds
            return min(cap, budget.max_group_size(length))

        longest = budget.padded_length(high)
        shapes = [StepShape(f"one sample of {what}", 1, longest)]
        if rows_of(high) > 1:
            many = "max_seq_len samples" if lengths is None else f"samples of {high} tokens"
            shapes.append(StepShape(f"a full group of {many}", rows_of(high), longest))
        # Between the two ends, the lengths whose groups hold the most tokens (a cap or
        # the budget's rounding can leave both ends short of it), the longest of them.
        candidates = range(low, high + 1)
        most = max(candidates, key=lambda n: (rows_of(n) * budget.padded_length(n), n))
        shapes.append(
            StepShape(
                "the group with the most tokens",
                rows_of(most),
                budget.padded_length(most),
            )
        )
        # The most rows (shortest samples), at the longest length that still allows them.
        rows = rows_of(low)
        widest = max(n for n in candidates if rows_of(n) >= rows)
        shapes.append(
            StepShape(
                f"the largest group ({rows} rows) of the shortest samples",
                rows,
                budget.padded_length(widest),
            )
        )
        return _distinct(shapes)

    def fixed_size_shapes(
        self,
        budget: Budget,
        max_seq_len: int,
        batch_size: int,
        lengths: LengthRange | None = None,
    ) -> list[StepShape]:
        """The largest step of a fixed-size mode (``standard``, ``sorted``), which ignores
        the budget: ``batch_size`` rows of ``max_seq_len`` tokens (of the longest training
        sample, where a length pass measured it)."""
        _, high, what = _extremes(max_seq_len, lengths)
        longest = budget.padded_length(high)
        return [StepShape(f"batch_size={batch_size} samples of {what}", batch_size, longest)]

    @property
    def patch_budget(self) -> PatchBudget | None:
        """The vision-tower bound of a group, or ``None`` without ``max_patches``."""
        if self.max_patches is None:
            return None
        return PatchBudget(self.max_patches, self.patch_attention_weight)


def _distinct(shapes: list[StepShape]) -> list[StepShape]:
    """The shapes without repeats of an earlier one's rows, tokens and image, in order."""
    seen: set[tuple[int, int, tuple[int, int, int] | None]] = set()
    kept = []
    for shape in shapes:
        key = (shape.rows, shape.tokens, shape.image_grid)
        if key not in seen:
            seen.add(key)
            kept.append(shape)
    return kept


@dataclass(frozen=True)
class ImageExtent:
    """The largest image an image-text run's resize allows: its ``(t, h, w)`` patch grid
    and the patches merged per side into one LLM token."""

    grid: tuple[int, int, int]
    merge_size: int

    @property
    def patches(self) -> int:
        t, h, w = self.grid
        return t * h * w

    @property
    def tokens(self) -> int:
        """Its ``<|image_pad|>`` tokens."""
        return self.patches // self.merge_size**2


LengthRange = tuple[int, int]
"""The shortest and the longest training sample, in tokens."""


def _extremes(max_seq_len: int, lengths: LengthRange | None) -> tuple[int, int, str]:
    """The shortest and longest sample a step can hold, and how to name the longest:
    ``max_seq_len`` and the shortest sample with a target (2 tokens) when no length pass
    measured the run's samples."""
    if lengths is None:
        return 2, max_seq_len, f"max_seq_len={max_seq_len}"
    low, high = max(2, lengths[0]), min(max_seq_len, lengths[1])
    return min(low, high), high, f"{high} tokens (the longest training sample)"


@dataclass(frozen=True)
class PaddedRows(RowLayout):
    """One right-padded row per sample (``pad_collate``); groups are cut by the padded
    cost ``g x row_cost(L)`` of their longest sample."""


@dataclass(frozen=True)
class PackedRows(RowLayout):
    """One padding-free row per group (``pack_collate``); groups are cut greedily under
    the packed row's cost.

    A packed row of ``N = sum L_i`` tokens costs ``N`` (rounded up to ``pad_to_multiple_of``)
    plus the attention term: ``w * sum L_i**2`` where the kernel skips the blocks across
    samples (flash-attention varlen, flex attention), ``w * N**2`` where it computes the
    dense block mask's whole square (sdpa, eager: ``packed_attention=dense``).
    """

    packed_attention: PackedAttention = PackedAttention.VARLEN
    """``varlen`` or ``dense``: the attention cost of a packed row (``w * sum L_i**2`` or
    ``w * N**2``); checked against ``model.architecture.attn_implementation`` at start."""

    def __post_init__(self) -> None:
        super().__post_init__()
        kind = enum_member(PackedAttention, f"{ROWS_KEY}.packed_attention", self.packed_attention)
        object.__setattr__(self, "packed_attention", kind)

    def budget(self, token_budget: int) -> Budget:
        return PackedBudget(
            token_budget,
            self.attention_weight or 0.0,
            pad_to_multiple_of=self.pad_to_multiple_of,
            dense_packed_attention=self.packed_attention is PackedAttention.DENSE,
        )

    def padded_tokens(self, lengths: Sequence[int]) -> int:
        return self._rounded(sum(lengths)) if lengths else 0

    def worst_case_shapes(
        self,
        budget: Budget,
        max_seq_len: int,
        batch_cap: int | None,
        lengths: LengthRange | None = None,
    ) -> list[StepShape]:
        """One full packed row of the budget's tokens (its block mask is ``B x B`` under
        sdpa and eager), or one longer sample alone."""
        _, high, _ = _extremes(max_seq_len, lengths)
        row = max(budget.padded_length(high), budget.padded_length(budget.token_budget))
        return [StepShape("one full packed row", 1, row, one_row=True)]

    def with_model_cost(self, weight: float, attn_implementation: str) -> RowLayout:
        """As :meth:`RowLayout.with_model_cost`, and the packed rows' attention is the
        backend's (:func:`packed_attention_of`): sdpa and eager a dense square."""
        if self.attention_weight is not None:
            return self
        kind = packed_attention_of(attn_implementation)
        return replace(self, attention_weight=weight, packed_attention=kind)

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


ROW_SETTINGS: dict[str, Callable[[Any], int]] = {
    "pad_to_multiple_of": int,
    # A padded layout has no packed_attention: it sends the default's.
    "packed_attention": lambda kind: list(PackedAttention).index(kind or PackedAttention.VARLEN),
    "max_patches": lambda patches: patches or 0,
    "patch_attention_weight": lambda weight: round(weight * 1e9),
}
"""The layouts' knobs every rank must share, with their integer encodings (weights in
1e-9), in the order of the handshake message
(:data:`~odb_lightning.core.handshake.SHARED_SETTINGS`)."""
