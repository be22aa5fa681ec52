"""Seeded synthetic samples with token lengths from a profile: lognormal
(:func:`~odb_lightning.core.profiles.lognormal_lengths`) or bin by bin
(:class:`~odb_lightning.core.profiles.HistogramProfile`), for tests and simulation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from odb_lightning.core.profiles import CASE_STUDY_LENGTHS, HistogramProfile, lognormal_lengths
from odb_lightning.sample import IGNORE_INDEX, Sample


@dataclass(frozen=True, slots=True)
class LengthProfile:
    """A lognormal length distribution by its mean (tokens) and coefficient of variation."""

    mean_length: float
    cv: float

    def lengths(self, n: int, seed: int, max_len: int | None = None) -> list[int]:
        """``n`` seeded lengths (:func:`~odb_lightning.core.profiles.lognormal_lengths`)."""
        return lognormal_lengths(n, self.mean_length, self.cv, seed, max_len)


# ShareGPT regimes with the Qwen2.5 ChatML template at <= 4096 tokens (how they were
# measured: docs/data.md, "Data sources"); the bucketed-shuffle case study's 902,087-sample
# set bin by bin (experiments/scale_data/README.md).
LENGTH_PROFILES: dict[str, LengthProfile | HistogramProfile] = {
    "sharegpt_whole": LengthProfile(1456.0, 0.54),
    "sharegpt_first_exchange": LengthProfile(501.0, 0.92),
    "sharegpt_mix": LengthProfile(977.0, 0.82),
    "casestudy": CASE_STUDY_LENGTHS,
}


class SyntheticDataset(Dataset[Sample]):
    """Random token samples of given lengths.

    Each sample is a prompt (the first ``prompt_fraction`` of its tokens, label ``-100``)
    followed by a supervised response. Item ``i`` depends only on ``(seed, i)`` and its
    length; lengths are raised to at least 2 (a prompt token and a supervised one).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        seed: int = 0,
        vocab_size: int = 151_643,
        prompt_fraction: float = 0.3,
    ) -> None:
        if not 0.0 <= prompt_fraction < 1.0:
            raise ValueError(f"prompt_fraction must be in [0, 1), got {prompt_fraction}")
        self.lengths = [max(2, n) for n in lengths]
        self.seed = seed
        self.vocab_size = vocab_size
        self.prompt_fraction = prompt_fraction

    @classmethod
    def from_profile(
        cls,
        name: str,
        num_samples: int,
        *,
        max_seq_len: int = 4096,
        seed: int = 0,
        **kwargs: object,
    ) -> SyntheticDataset:
        """``num_samples`` samples with lengths drawn from one of the
        :data:`LENGTH_PROFILES` by name (seeded by ``seed``, at most ``max_seq_len``)."""
        lengths = LENGTH_PROFILES[name].lengths(num_samples, seed, max_seq_len)
        return cls(lengths, seed=seed, **kwargs)

    def num_prompt_tokens(self, index: int) -> int:
        """The unsupervised prompt tokens of item ``index`` (at least 1)."""
        return max(1, int(self.lengths[index] * self.prompt_fraction))

    def num_loss_tokens(self, index: int) -> int:
        """Supervised tokens of item ``index`` (shifted ``labels != -100``), without
        building it: every token after the prompt."""
        return self.lengths[index] - self.num_prompt_tokens(index)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> Sample:
        length = self.lengths[index]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        input_ids = torch.randint(0, self.vocab_size, (length,), generator=generator)
        labels = input_ids.clone()
        labels[: self.num_prompt_tokens(index)] = IGNORE_INDEX
        return {"input_ids": input_ids, "labels": labels}
