"""The image part of a batch of image-text samples: patches, grids, rotary positions.

A sample with images carries ``pixel_values`` (``[patches, D]``), ``image_grid_thw``
(``[images, 3]``) and its rotary ``position_ids`` (``[rows, L]``, row 0 the text
positions) beside ``input_ids``/``labels``; a text-only sample of an image set carries
them empty (no patch, no image) and with plain positions. The vision family computes the
positions per sample in the loader workers (its position rule, such as M-RoPE's), so they
are right in a padded row and in a row of several samples one after the other, where
every sample's positions restart at 0. The collates know no family: the row count is the
one the samples carry.

:func:`~odb_lightning.runtime.batch.pad_collate` and
:func:`~odb_lightning.runtime.batch.pack_collate` add these fields when their samples
have images. A batch concatenates the samples' ``pixel_values`` along the patch axis and
their ``image_grid_thw`` along the image axis, in sample order: the order of the image
blocks in the batch's ``input_ids`` (row-major), in which the model scatters the vision
features into the image-token positions. ``position_ids`` is ``[rows, batch, L]``:
row 0 the per-sample text positions (from which ``transformers`` builds the causal and
per-sample masks), the other rows the family's (M-RoPE: temporal, height and width).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from odb_lightning.sample import IMAGE_GRID_THW, MROPE_POSITIONS, PIXEL_VALUES


def has_image_fields(samples: Sequence[Mapping[str, object]]) -> bool:
    """Whether the samples are image-text samples (they carry ``image_grid_thw``)."""
    return any(IMAGE_GRID_THW in s for s in samples)


def position_rows(samples: Sequence[Mapping[str, torch.Tensor]]) -> int:
    """The rows of the batch's positions: those its samples carry (the vision family's).

    Raises:
        ValueError: No sample carries positions, or two carry different row counts.
    """
    rows = {int(s[MROPE_POSITIONS].shape[0]) for s in samples if MROPE_POSITIONS in s}
    if len(rows) != 1:
        found = ", ".join(map(str, sorted(rows))) or "none"
        raise ValueError(
            f"the image-text samples of a batch must carry '{MROPE_POSITIONS}' with one "
            f"row count (the vision family's), got {found}"
        )
    return rows.pop()


def sample_positions(sample: Mapping[str, torch.Tensor], rows: int) -> torch.Tensor:
    """The sample's ``[rows, L]`` positions (plain ones for a sample that has none, such as
    the padding segment that rounds a row of several samples up)."""
    length = sample["input_ids"].numel()
    positions = sample.get(MROPE_POSITIONS)
    if positions is None:
        return torch.arange(length).expand(rows, length)
    if tuple(positions.shape) != (rows, length):
        raise ValueError(
            f"'{MROPE_POSITIONS}' has shape {tuple(positions.shape)}, expected ({rows}, {length})"
        )
    return positions.long()


def image_inputs(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of a batch, in sample order.

    Raises:
        ValueError: The patches and the grids disagree.
    """
    pixels = [s[PIXEL_VALUES] for s in samples if PIXEL_VALUES in s]
    grids = [s[IMAGE_GRID_THW].reshape(-1, 3) for s in samples if IMAGE_GRID_THW in s]
    pixel_values = torch.cat(pixels).to(torch.float32)
    grid_thw = torch.cat(grids).to(torch.long)
    patches = int(grid_thw.prod(dim=-1).sum()) if grid_thw.numel() else 0
    if pixel_values.shape[0] != patches:
        raise ValueError(
            f"the batch's pixel_values hold {pixel_values.shape[0]} patches, its "
            f"image_grid_thw {patches}"
        )
    return {PIXEL_VALUES: pixel_values, IMAGE_GRID_THW: grid_thw}


def padded_positions(samples: Sequence[Mapping[str, torch.Tensor]], width: int) -> torch.Tensor:
    """``[rows, batch, width]`` positions of a right-padded batch (0 on padding)."""
    rows = position_rows(samples)
    positions = torch.zeros((rows, len(samples), width), dtype=torch.long)
    for row, sample in enumerate(samples):
        own = sample_positions(sample, rows)
        positions[:, row, : own.shape[1]] = own
    return positions
