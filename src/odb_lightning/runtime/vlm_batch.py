"""Collates of image-text samples: images beside the tokens, 3-D rotary positions per sample.

A sample with images carries ``pixel_values`` (``[patches, D]``), ``image_grid_thw``
(``[images, 3]``) and its rotary ``position_ids`` (``[4, L]``) beside
``input_ids``/``labels``; a text-only sample of an image set carries them empty (no
patch, no image) and with plain positions. The positions are computed per sample in the
loader workers (:func:`odb_lightning.data.vision.mrope_positions`, Qwen2-VL's
``get_rope_index`` semantics), so they are right in a padded row and in a packed one,
where every sample's positions restart at 0.

A batch concatenates the samples' ``pixel_values`` along the patch axis and their
``image_grid_thw`` along the image axis, in sample order: the order of the image blocks
in the batch's ``input_ids`` (row-major), in which the model scatters the vision
features into the ``<|image_pad|>`` positions. ``position_ids`` is ``[4, batch, L]``:
row 0 the per-sample text positions (from which ``transformers`` builds the causal and
packed-sequence masks), rows 1-3 the temporal, height and width positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from odb_lightning.runtime.batch import pack_collate, pad_collate
from odb_lightning.sample import IMAGE_GRID_THW, MROPE_POSITIONS, PIXEL_VALUES

TEXT_KEYS = ("input_ids", "labels")


def has_image_fields(samples: Sequence[Mapping[str, object]]) -> bool:
    """Whether the samples are image-text samples (they carry ``image_grid_thw``)."""
    return any(IMAGE_GRID_THW in s for s in samples)


def _positions(sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The sample's ``[4, L]`` positions (plain ones for a sample that has none)."""
    length = sample["input_ids"].numel()
    positions = sample.get(MROPE_POSITIONS)
    if positions is None:
        return torch.arange(length).expand(4, length)
    if tuple(positions.shape) != (4, length):
        raise ValueError(
            f"'{MROPE_POSITIONS}' has shape {tuple(positions.shape)}, expected (4, {length})"
        )
    return positions.long()


def _images(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
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


def vlm_pad_collate(
    samples: Sequence[Mapping[str, torch.Tensor]], pad_id: int = 0, pad_to_multiple_of: int = 1
) -> dict[str, torch.Tensor]:
    """:func:`~odb_lightning.runtime.batch.pad_collate` plus the images and
    ``position_ids`` ``[4, batch, longest]`` (0 on padding)."""
    text = [{k: s[k] for k in TEXT_KEYS if k in s} for s in samples]
    batch = pad_collate(text, pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of)
    positions = torch.zeros((4, *batch["input_ids"].shape), dtype=torch.long)
    for row, sample in enumerate(samples):
        sample_positions = _positions(sample)
        positions[:, row, : sample_positions.shape[1]] = sample_positions
    return batch | _images(samples) | {"position_ids": positions}


def vlm_pack_collate(
    samples: Sequence[Mapping[str, torch.Tensor]], pad_to_multiple_of: int = 1, pad_id: int = 0
) -> dict[str, torch.Tensor | int]:
    """:func:`~odb_lightning.runtime.batch.pack_collate` plus the images, with
    ``position_ids`` ``[4, 1, N]`` restarting at every sample (and at the padding segment
    that rounds the row up, if any)."""
    text = [{k: s[k] for k in TEXT_KEYS if k in s} for s in samples]
    batch = pack_collate(text, pad_to_multiple_of=pad_to_multiple_of, pad_id=pad_id)
    rows = [_positions(s) for s in samples]
    tail = batch["input_ids"].shape[1] - sum(r.shape[1] for r in rows)
    if tail:
        rows.append(torch.arange(tail).expand(4, tail))
    return batch | _images(samples) | {"position_ids": torch.cat(rows, dim=1).unsqueeze(1)}
