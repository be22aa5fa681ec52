"""Small value types shared by the core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SampleInfo:
    """What the grouping window knows about one preprocessed sample.

    Attributes:
        sample_id: The dataset index of the sample (what audits report).
        length: Token count after the whole input pipeline.
        num_loss_tokens: Supervised tokens (shifted ``labels != -100``).
        position: Arrival order in this rank's shard for this epoch; breaks length ties
            deterministically and gives groups their age for the overflow rule.
        num_patches: ViT patches of the sample's images (0 for text-only samples): the
            vision tower's share of its cost, for the patch budget
            (:mod:`~odb_lightning.core.patch_budget`).
        num_image_tokens: Of ``length``, the tokens that stand for images.
        patch_square_sum: ``sum(p**2)`` over its images of ``p`` patches (the patch
            budget's per-image quadratic term).
        num_bytes: Size of the serialized sample the runtime holds until it is collated
            (for ``batching.policy.window_max_mib``; 0: not counted).
    """

    sample_id: int
    length: int
    num_loss_tokens: int = 0
    position: int = 0
    num_patches: int = 0
    num_image_tokens: int = 0
    patch_square_sum: int = 0
    num_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Group:
    """Samples emitted together in one step, sorted longest first."""

    samples: tuple[SampleInfo, ...]

    @property
    def size(self) -> int:
        return len(self.samples)

    @property
    def longest(self) -> int:
        return self.samples[0].length

    @property
    def num_loss_tokens(self) -> int:
        return sum(s.num_loss_tokens for s in self.samples)

    @property
    def num_real_tokens(self) -> int:
        return sum(s.length for s in self.samples)

    @property
    def num_padded_tokens(self) -> int:
        return self.size * self.longest

    @property
    def age(self) -> int:
        """Position of the oldest member: lower is older."""
        return min(s.position for s in self.samples)
