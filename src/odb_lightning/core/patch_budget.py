"""The patch budget: a group of image-text samples also bounds its vision-tower work.

A dynamic-resolution VLM runs two models per step: the language model on the group's
padded tokens (``g x L``, :class:`~odb_lightning.core.budget.Budget`) and the vision tower
on the group's ViT patches. Two groups of equal token cost can hold very different patch
counts (an image's LLM tokens are its patches / 4, but a text-heavy sample has few), so
the tower's memory and time need their own bound, ``max_patches``. The tower attends
within each image, so an optional per-image quadratic term ``w_p * p**2`` charges its
attention: the patch cost of a group is ``sum over its images of (p + w_p * p**2)``.

:func:`cut_groups` walks a window sorted longest first and closes a group when the next
sample would break either budget. Both costs can only fall when a sample leaves a group
of adjacent samples (the token cost's longest member is the first; the patch cost is a
sum of non-negative terms), so every part of a feasible group is feasible, and for such
constraints taking as many samples as fit at each step gives the fewest groups of
adjacent samples (exchange argument: the greedy end is never before any other
partition's k-th end). A sample that alone breaks a budget forms its own group and is
counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.budget import Budget


@dataclass(frozen=True, slots=True)
class PatchBudget:
    """The per-step bound on the vision tower's work.

    Attributes:
        max_patches: Most patch cost of one group.
        patch_attention_weight: ``w_p`` of the per-image quadratic term; 0: patches only.
    """

    max_patches: int
    patch_attention_weight: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_patches, int) or isinstance(self.max_patches, bool):
            raise ValueError(f"max_patches must be a positive integer, got {self.max_patches!r}")
        if self.max_patches < 1:
            raise ValueError(f"max_patches must be a positive integer, got {self.max_patches!r}")
        weight = self.patch_attention_weight
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"patch_attention_weight must be finite and >= 0, got {weight!r}")

    def sample_cost(self, num_patches: int, patch_square_sum: int = 0) -> float:
        """Patch cost of one sample, ``sum(p + w_p * p**2)`` over its images, from its
        patches and their per-image squares summed (what
        :class:`~odb_lightning.core.types.SampleInfo` carries)."""
        return num_patches + self.patch_attention_weight * patch_square_sum


@dataclass(frozen=True, slots=True)
class GroupCuts:
    """Groups of adjacent samples of a window sorted longest first.

    Attributes:
        ends: The end index (exclusive) of each group, increasing; the last is the
            window's size.
        over_token_budget: Groups of one sample that alone exceed the token budget.
        over_patch_budget: Groups of one sample that alone exceed ``max_patches``.
    """

    ends: tuple[int, ...]
    over_token_budget: int
    over_patch_budget: int

    def groups(self) -> list[range]:
        """The index range of each group."""
        starts = (0, *self.ends[:-1])
        return [range(start, end) for start, end in zip(starts, self.ends, strict=True)]


def cut_groups(
    lengths: Sequence[int],
    patches: Sequence[int],
    budget: Budget,
    patch_budget: PatchBudget | None = None,
    patch_squares: Sequence[int] | None = None,
) -> GroupCuts:
    """The fewest groups of adjacent samples within both budgets.

    Args:
        lengths: LLM tokens of each sample (visual tokens included), longest first.
        patches: ViT patches of each sample (0 for text-only).
        budget: The token budget (``g x L`` with its attention term).
        patch_budget: The patch budget; ``None``: tokens only.
        patch_squares: Per sample, its images' patch counts squared and summed (needed
            by a quadratic term; ``None``: no sample has one).

    Raises:
        ValueError: Lengths not sorted longest first, not positive, a sample count
            that differs between the sequences, or a quadratic term without squares.
    """
    squares = [0] * len(patches) if patch_squares is None else list(patch_squares)
    if not len(lengths) == len(patches) == len(squares):
        problem = f"{len(lengths)} lengths, {len(patches)} patch counts, {len(squares)} squares"
        raise ValueError(f"one entry per sample needed: {problem}")
    if patch_budget and patch_budget.patch_attention_weight and patch_squares is None:
        raise ValueError("patch_attention_weight > 0 needs the samples' patch_squares")
    for k, length in enumerate(lengths):
        if length < 1 or (k and length > lengths[k - 1]):
            raise ValueError(f"lengths must be positive and sorted longest first (index {k})")
    costs = [
        patch_budget.sample_cost(p, q) if patch_budget else 0.0
        for p, q in zip(patches, squares, strict=True)
    ]
    ends: list[int] = []
    over_tokens = over_patches = 0
    start = 0
    while start < len(lengths):
        end, patches = start + 1, costs[start]
        while end < len(lengths) and budget.fits(end + 1 - start, lengths[start]):
            if patch_budget is not None and patches + costs[end] > patch_budget.max_patches:
                break
            patches += costs[end]
            end += 1
        if end - start == 1:
            over_tokens += budget.is_over_budget(lengths[start])
            over_patches += patch_budget is not None and costs[start] > patch_budget.max_patches
        ends.append(end)
        start = end
    return GroupCuts(tuple(ends), over_tokens, over_patches)
