"""Token-budget cost model.

A group of ``g`` samples whose longest has ``L`` tokens is padded to ``g x L`` tokens. With
an attention weight ``w`` the cost adds the quadratic attention term per row:
``g * (L + w * L**2)``. A group must cost at most ``token_budget``; a sample that alone
exceeds the budget is still emitted, as a group of one, and is counted as over budget.

With ``pad_to_multiple_of = m`` the collate pads each row to a multiple of ``m`` (tensor
cores and compiled kernels like round shapes), so the cost is taken of the rounded length
``ceil(L / m) * m``: rounding after grouping would push ``g x L`` over the budget.

A row layout whose rows cost something else subclasses :class:`Budget` beside its own
definition (:mod:`~odb_lightning.core.rows`) and overrides :meth:`Budget.group_cost`,
:meth:`Budget.aggregate_cost` and :meth:`Budget.fits_group`; the grouping, the window, the
sync figures and the plan statistics ask the budget they are given, never which layout it
is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from odb_lightning.core.checks import check_positive_int, check_weight

BUDGET_QUANTUM = 256
"""``token_budget=auto``, the suggested budgets and the budget token-target steps resolve
are multiples of this many tokens."""


@dataclass(frozen=True, slots=True)
class Budget:
    """The per-step token budget ``L_max``.

    Attributes:
        token_budget: Maximum padded cost of one group.
        attention_weight: Weight of the quadratic attention term; 0 for the plain
            padded-token budget.
    """

    token_budget: int
    attention_weight: float = 0.0
    pad_to_multiple_of: int = 1

    balances_padding: ClassVar[bool] = True
    """Groups are padded rows, so a cut can move slack to where it saves padding
    (:func:`~odb_lightning.core.grouping.padded_cuts`); else the greedy cut is final."""

    def __post_init__(self) -> None:
        check_positive_int("token_budget", self.token_budget)
        check_weight("attention_weight", self.attention_weight)
        check_positive_int("pad_to_multiple_of", self.pad_to_multiple_of)

    def padded_length(self, length: int) -> int:
        """``length`` rounded up to a multiple of ``pad_to_multiple_of``."""
        multiple = self.pad_to_multiple_of
        return -(-length // multiple) * multiple

    def row_cost(self, longest: int) -> float:
        longest = self.padded_length(longest)
        return longest + self.attention_weight * longest * longest

    def cost(self, group_size: int, longest: int) -> float:
        return group_size * self.row_cost(longest)

    def fits(self, group_size: int, longest: int) -> bool:
        return self.cost(group_size, longest) <= self.token_budget

    def max_group_size(self, longest: int) -> int:
        """``max(1, floor(budget / row_cost(L)))``: never an empty group."""
        if longest <= 0:
            raise ValueError(f"sample length must be positive, got {longest}")
        return max(1, int(self.token_budget // self.row_cost(longest)))

    def is_over_budget(self, length: int) -> bool:
        """True when one sample alone costs more than the budget."""
        return self.row_cost(length) > self.token_budget

    def group_cost(self, lengths: Sequence[int]) -> float:
        """Cost of one group of samples of these lengths: ``g`` rows of the longest."""
        return self.cost(len(lengths), max(lengths))

    def aggregate_cost(self, size: int, longest: int, total: int, sum_of_squares: int) -> float:
        """:meth:`group_cost` of a group of ``size`` samples, the longest ``longest``
        tokens, ``total`` in all, their squares summing to ``sum_of_squares``."""
        return self.cost(size, longest)

    def fits_group(self, size: int, longest: int, total: int, sum_of_squares: int) -> bool:
        """A group of ``size`` samples (the longest ``longest`` tokens, ``total`` in all,
        their squares summing to ``sum_of_squares``) is within the budget."""
        return self.fits(size, longest)
