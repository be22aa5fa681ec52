"""A synthetic chat dataset with injectable faults, and rank-skewed shards of it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from odb_lightning.sample import MROPE_POSITIONS

IGNORE = -100


class SyntheticChatDataset:
    """Seeded token lengths; the first third of each sample is an unsupervised prompt.

    Args:
        lengths: Token length of each sample.
        fail_index: ``dataset[fail_index]`` raises ``ZeroDivisionError``.
        bad_indices: These samples have empty ``input_ids``.
        hang_index: ``dataset[hang_index]`` never returns.
        fault_marker: File where the fetch of ``fail_index`` or ``hang_index`` writes its
            ``time.monotonic()`` first (see :func:`read_fault_marker`).
        delay_s: Every ``dataset[i]`` sleeps this long first (a slow file system).
    """

    def __init__(
        self,
        lengths: list[int],
        fail_index: int | None = None,
        bad_indices: frozenset[int] = frozenset(),
        hang_index: int | None = None,
        fault_marker: str | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.lengths = lengths
        self.delay_s = delay_s
        self.fail_index = fail_index
        self.bad_indices = bad_indices
        self.hang_index = hang_index
        self.fault_marker = fault_marker

    @classmethod
    def seeded(cls, n: int, seed: int = 0, **kwargs: Any) -> SyntheticChatDataset:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, 300, (n,), generator=generator).tolist()
        return cls(lengths, **kwargs)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        if index in (self.fail_index, self.hang_index) and self.fault_marker is not None:
            Path(self.fault_marker).write_text(repr(time.monotonic()))
        if index == self.fail_index:
            raise ZeroDivisionError(f"synthetic failure in sample {index}")
        if index == self.hang_index:
            threading.Event().wait()  # a stuck sample: only terminating the worker ends it
        if index in self.bad_indices:
            return {"input_ids": torch.zeros(0, dtype=torch.long)}
        length = self.lengths[index]
        input_ids = (torch.arange(length) * 7 + index) % 1000
        labels = input_ids.clone()
        labels[: length // 3] = IGNORE
        return {"input_ids": input_ids, "labels": labels}

    def num_loss_tokens(self, index: int) -> int:
        length = self.lengths[index]
        return length - max(1, length // 3)


class SyntheticPatchDataset(SyntheticChatDataset):
    """:class:`SyntheticChatDataset` whose samples also carry one image of a seeded even
    number of ViT patches (0 for some: text-only), as ``pixel_values`` ``[p, 4]`` and
    ``image_grid_thw`` ``[[1, 2, p / 2]]`` (what the patch budget reads), with plain
    ``position_ids`` in four rows as an image sample carries them.

    Args:
        lengths: Token length of each sample.
        patches: ViT patches of each sample's image (0: no image).
    """

    def __init__(self, lengths: list[int], patches: list[int], **kwargs: Any) -> None:
        super().__init__(lengths, **kwargs)
        if len(patches) != len(lengths) or any(p < 0 or p % 2 for p in patches):
            raise ValueError("patches: one even count >= 0 per sample")
        self.patches = patches

    @classmethod
    def seeded(cls, n: int, seed: int = 0, **kwargs: Any) -> SyntheticPatchDataset:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, 300, (n,), generator=generator).tolist()
        halves = torch.randint(0, 200, (n,), generator=generator)
        patches = torch.where(halves < 40, 0, 2 * halves).tolist()  # a fifth text-only
        return cls(lengths, patches, **kwargs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(index)
        patches = self.patches[index]
        if patches and sample["input_ids"].numel():
            sample["pixel_values"] = torch.zeros(patches, 4)
            sample["image_grid_thw"] = torch.tensor([[1, 2, patches // 2]])
            # Plain positions in a vision family's four rows, as an image sample carries.
            length = sample["input_ids"].numel()
            sample[MROPE_POSITIONS] = torch.arange(length).expand(4, length).clone()
        return sample


def read_fault_marker(path: Path) -> float:
    """The ``time.monotonic()`` a dataset wrote when it reached its fault index."""
    return float(path.read_text())


@dataclass(frozen=True)
class SkewedShard:
    """Rank-skewed, unequal shards: sorted by length, rank ``r`` takes a contiguous slice
    of size proportional to ``weights[r]`` (rank 0 the longest), shuffled per epoch."""

    lengths: tuple[int, ...]
    weights: tuple[int, ...]
    rank: int
    seed: int = 0

    def __call__(self, epoch: int) -> list[int]:
        by_length = sorted(range(len(self.lengths)), key=lambda i: (-self.lengths[i], i))
        total = sum(self.weights)
        bounds = [
            len(by_length) * sum(self.weights[:r]) // total for r in range(len(self.weights) + 1)
        ]
        indices = by_length[bounds[self.rank] : bounds[self.rank + 1]]
        generator = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        return [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
