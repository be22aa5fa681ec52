"""Token-budget cost model.

A group of ``g`` samples whose longest has ``L`` tokens is padded to ``g x L`` tokens. With
an attention weight ``w`` the cost adds the quadratic attention term per row:
``g * (L + w * L**2)``. A group must cost at most ``token_budget``; a sample that alone
exceeds the budget is still emitted, as a group of one, and is counted as over budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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

    def __post_init__(self) -> None:
        if not isinstance(self.token_budget, int) or self.token_budget < 1:
            raise ValueError(f"token_budget must be a positive integer, got {self.token_budget!r}")
        if not math.isfinite(self.attention_weight) or self.attention_weight < 0:
            raise ValueError(
                f"attention_weight must be finite and >= 0, got {self.attention_weight!r}"
            )

    def row_cost(self, longest: int) -> float:
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
