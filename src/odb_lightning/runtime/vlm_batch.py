"""The image part of a batch of image-text samples: patches, grids, 3-D rotary positions.

A sample with images carries ``pixel_values`` (``[patches, D]``), ``image_grid_thw``
(``[images, 3]``) and its rotary ``position_ids`` (``[4, L]``) beside
``input_ids``/``labels``; a text-only sample of an image set carries them empty (no
patch, no image) and with plain positions. The positions are computed per sample in the
loader workers (:func:`odb_lightning.data.vision_family.mrope_positions`, Qwen2-VL's
``get_rope_index`` semantics), so they are right in a padded row and in a row of
several samples one after the other, where every sample's positions restart at 0.

:func:`~odb_lightning.runtime.batch.pad_collate` and
:func:`~odb_lightning.runtime.batch.pack_collate` add these fields when their samples
have images. A batch concatenates the samples' ``pixel_values`` along the patch axis and
their ``image_grid_thw`` along the image axis, in sample order: the order of the image
blocks in the batch's ``input_ids`` (row-major), in which the model scatters the vision
features into the ``<|image_pad|>`` positions. ``position_ids`` is ``[4, batch, L]``:
row 0 the per-sample text positions (from which ``transformers`` builds the causal and
per-sample masks), rows 1-3 the temporal, height and width positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from odb_lightning.sample import IMAGE_GRID_THW, MROPE_POSITIONS, PIXEL_VALUES


def has_image_fields(samples: Sequence[Mapping[str, object]]) -> bool:
    """Whether the samples are image-text samples (they carry ``image_grid_thw``)."""
    return any(IMAGE_GRID_THW in s for s in samples)


def sample_positions(sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The sample's ``[4, L]`` positions (plain ones for a sample that has none, such as
    the padding segment that rounds a row of several samples up)."""
    length = sample["input_ids"].numel()
    positions = sample.get(MROPE_POSITIONS)
    if positions is None:
        return torch.arange(length).expand(4, length)
    if tuple(positions.shape) != (4, length):
        raise ValueError(
            f"'{MROPE_POSITIONS}' has shape {tuple(positions.shape)}, expected (4, {length})"
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
    """``[4, batch, width]`` positions of a right-padded batch (0 on padding)."""
    positions = torch.zeros((4, len(samples), width), dtype=torch.long)
    for row, sample in enumerate(samples):
        own = sample_positions(sample)
        positions[:, row, : own.shape[1]] = own
    return positions
