"""A dataset that changes with the epoch (augmentation) sees the epoch in every worker."""

from __future__ import annotations

import pytest
import torch

from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.planned import PlannedLoader


class EpochLengths(torch.utils.data.Dataset):
    """Sample ``i`` has ``2 + i + epoch`` tokens: lengths reveal the epoch a worker saw."""

    def __init__(self, size: int) -> None:
        self.size, self.epoch = size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.ones(2 + index + self.epoch, dtype=torch.long)}


def lengths_by_id(batches) -> dict[int, int]:
    found = {}
    for batch in batches:
        rows = batch.inputs["attention_mask"].sum(dim=1).tolist()
        found.update(zip(batch.meta.sample_ids, rows, strict=True))
    return found


@pytest.mark.parametrize("persistent", [True, False])
def test_odb_workers_see_each_epoch(persistent: bool) -> None:
    dataset = EpochLengths(24)
    with ODBLoader(
        dataset,
        token_budget=256,
        outstanding_depth=8,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context="fork",
    ) as loader:
        for epoch in (0, 3):
            loader.set_epoch(epoch)
            seen = lengths_by_id(loader)
            assert seen == {i: 2 + i + epoch for i in range(24)}


def test_planned_workers_see_each_epoch() -> None:
    dataset = EpochLengths(12)
    loader = PlannedLoader(
        dataset,
        lambda epoch: [list(range(i, i + 4)) for i in range(0, 12, 4)],
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    for epoch in (0, 2):
        loader.set_epoch(epoch)
        assert lengths_by_id(loader) == {i: 2 + i + epoch for i in range(12)}
    loader.close()
