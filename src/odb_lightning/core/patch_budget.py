"""The patch budget: a group of image-text samples also bounds its vision-tower work.

A dynamic-resolution VLM runs two models per step: the language model on the group's
padded tokens (``g x L``, :class:`~odb_lightning.core.budget.Budget`) and the vision tower
on the group's ViT patches. Two groups of equal token cost can hold very different patch
counts (an image's LLM tokens are its patches / 4, but a text-heavy sample has few), so
the tower's memory and time need their own bound, ``max_patches``. The tower attends
within each image, so an optional per-image quadratic term ``w_p * p**2`` charges its
attention: the patch cost of a group is ``sum over its images of (p + w_p * p**2)``.

The grouping window passes the budget to :func:`~odb_lightning.core.grouping.greedy_cuts`,
which walks the window sorted longest first and closes a group when the next sample
would break either budget. Both costs can only fall when a sample leaves a group of
adjacent samples (the token cost's longest member is the first; the patch cost is a sum
of non-negative terms), so every part of a feasible group is feasible, and for such
constraints taking as many samples as fit at each step gives the fewest groups of
adjacent samples (exchange argument: the greedy end is never before any other
partition's k-th end). A sample that alone breaks a budget forms its own group, and the
window counts it (``num_over_patch_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from odb_lightning.core.checks import check_positive_int, check_weight


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
        check_positive_int("max_patches", self.max_patches)
        check_weight("patch_attention_weight", self.patch_attention_weight)

    def sample_cost(self, num_patches: int, patch_square_sum: int = 0) -> float:
        """Patch cost of one sample, ``sum(p + w_p * p**2)`` over its images, from its
        patches and their per-image squares summed (what
        :class:`~odb_lightning.core.types.SampleInfo` carries)."""
        return num_patches + self.patch_attention_weight * patch_square_sum
