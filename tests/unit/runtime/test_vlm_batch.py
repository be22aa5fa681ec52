"""Collates of image-text samples: images in sample order, per-sample positions."""

from __future__ import annotations

import pytest
import torch

from helpers.vlm import model_sample
from odb_lightning.runtime.batch import pack_collate, pad_collate

SPECS = [([(90, 60), (40, 120)], 5, 7, 1), ([], 6, 8, 3), ([(70, 50)], 2, 4, 4)]


@pytest.fixture(scope="module")
def samples() -> list[dict[str, torch.Tensor]]:
    return [model_sample(*spec) for spec in SPECS]


def test_padded_batch_keeps_images_in_sample_order(samples) -> None:
    batch = pad_collate(samples, pad_id=0, pad_to_multiple_of=8)
    assert batch["input_ids"].shape[1] % 8 == 0
    assert torch.equal(batch["pixel_values"], torch.cat([s["pixel_values"] for s in samples]))
    assert torch.equal(batch["image_grid_thw"], torch.cat([s["image_grid_thw"] for s in samples]))
    positions = batch["position_ids"]
    assert positions.shape == (4, len(samples), batch["input_ids"].shape[1])
    for row, sample in enumerate(samples):
        length = sample["input_ids"].numel()
        assert torch.equal(positions[:, row, :length], sample["position_ids"])
        assert not positions[:, row, length:].any()  # padding
    # The image blocks appear in the batch's row-major order as the grids do.
    assert (
        int((batch["input_ids"] == 997).sum())
        == int(batch["image_grid_thw"].prod(dim=-1).sum()) // 4
    )


def test_packed_row_restarts_positions_per_sample(samples) -> None:
    batch = pack_collate(samples, pad_to_multiple_of=16, pad_id=0)
    total = sum(s["input_ids"].numel() for s in samples)
    width = batch["input_ids"].shape[1]
    assert width % 16 == 0 and width >= total
    positions = batch["position_ids"][:, 0]
    expected = torch.cat([s["position_ids"] for s in samples], dim=1)
    assert torch.equal(positions[:, :total], expected)
    assert torch.equal(positions[:, total:], torch.arange(width - total).expand(4, -1))
    starts = batch["cu_seqlens"][:-1].tolist()
    assert bool((positions[0, starts] == 0).all())
    assert torch.equal(batch["pixel_values"], torch.cat([s["pixel_values"] for s in samples]))


def test_patches_that_disagree_with_the_grids_are_refused(samples) -> None:
    broken = dict(samples[0])
    broken["pixel_values"] = broken["pixel_values"][:-1]
    with pytest.raises(ValueError, match="pixel_values hold"):
        pad_collate([broken, samples[1]])


def test_the_collates_lay_out_the_position_rows_the_samples_carry(samples) -> None:
    # A family with two position rows: the collates know no family, only the samples.
    two_rows = [{**s, "position_ids": s["position_ids"][:2]} for s in samples]
    padded = pad_collate(two_rows, pad_id=0)["position_ids"]
    assert padded.shape == (2, len(samples), padded.shape[2])
    packed = pack_collate(two_rows, pad_to_multiple_of=16, pad_id=0)["position_ids"]
    total = sum(s["input_ids"].numel() for s in samples)
    assert packed.shape[:2] == (2, 1)
    assert torch.equal(packed[:, 0, :total], torch.cat([s["position_ids"] for s in two_rows], 1))
    mixed = [two_rows[0], samples[1]]
    with pytest.raises(ValueError, match=r"'position_ids' with one row count .* got 2, 4"):
        pad_collate(mixed)
    no_positions = [{k: v for k, v in s.items() if k != "position_ids"} for s in samples]
    with pytest.raises(ValueError, match=r"got none"):
        pack_collate(no_positions)
