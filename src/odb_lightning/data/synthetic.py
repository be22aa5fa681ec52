"""Seeded synthetic samples with lognormal token lengths
(:func:`~odb_lightning.core.profiles.lognormal_lengths`), for tests and simulation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.sample import IGNORE_INDEX, Sample


@dataclass(frozen=True, slots=True)
class LengthProfile:
    """A length distribution by its mean (tokens) and coefficient of variation."""

    mean_length: float
    cv: float


# ShareGPT regimes with the Qwen2.5 ChatML template at <= 4096 tokens (how they were
# measured: docs/data.md, "Data sources").
LENGTH_PROFILES: dict[str, LengthProfile] = {
    "sharegpt_whole": LengthProfile(1456.0, 0.54),
    "sharegpt_first_exchange": LengthProfile(501.0, 0.92),
    "sharegpt_mix": LengthProfile(977.0, 0.82),
}


class SyntheticDataset(Dataset[Sample]):
    """Random token samples whose lengths follow a lognormal profile.

    Each sample is a prompt (the first ``prompt_fraction`` of its tokens, label ``-100``)
    followed by a supervised response. Item ``i`` depends only on ``(seed, i)``; lengths
    are at least 2 (a prompt token and a supervised one) and at most ``max_seq_len``.
    """

    def __init__(
        self,
        num_samples: int,
        mean_length: float,
        cv: float,
        *,
        max_seq_len: int = 4096,
        seed: int = 0,
        vocab_size: int = 151_643,
        prompt_fraction: float = 0.3,
    ) -> None:
        if not 0.0 <= prompt_fraction < 1.0:
            raise ValueError(f"prompt_fraction must be in [0, 1), got {prompt_fraction}")
        # At least 2 tokens: a prompt token and a supervised one.
        self.lengths = [
            max(2, n) for n in lognormal_lengths(num_samples, mean_length, cv, seed, max_seq_len)
        ]
        self.seed = seed
        self.vocab_size = vocab_size
        self.prompt_fraction = prompt_fraction

    @classmethod
    def from_profile(cls, name: str, num_samples: int, **kwargs: object) -> SyntheticDataset:
        """A dataset with one of the :data:`LENGTH_PROFILES` by name."""
        profile = LENGTH_PROFILES[name]
        return cls(num_samples, profile.mean_length, profile.cv, **kwargs)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> Sample:
        length = self.lengths[index]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        input_ids = torch.randint(0, self.vocab_size, (length,), generator=generator)
        labels = input_ids.clone()
        labels[: max(1, int(length * self.prompt_fraction))] = IGNORE_INDEX
        return {"input_ids": input_ids, "labels": labels}
