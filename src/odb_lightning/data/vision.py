"""Images as a Qwen2-VL-family model sees them: read, checked, resized and cut into patches.

The image processor is ``transformers``' own Qwen2-VL one, PIL backend (no torchvision):
an image is resized to multiples of ``patch_size * merge_size`` (28 px) with its pixel
count kept within ``[min_pixels, max_pixels]`` ("smart resize"), then cut into
``grid_t x grid_h x grid_w`` patches of 14 x 14 px (``grid_t = 1`` for a still image;
each patch row holds ``temporal_patch_size`` copies, ``3 * 2 * 14 * 14 = 1176`` values).
The vision tower sees every patch; the merger joins ``merge_size x merge_size``
neighbours into one LLM token, so an image costs ``grid_t * grid_h * grid_w / 4`` tokens
in ``input_ids`` (:func:`image_token_count`) and ``grid_t * grid_h * grid_w`` ViT patches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from odb_lightning.sample import BadSampleError

IMAGE_PLACEHOLDER = "<image>"
"""Marks where an image goes in a user turn (LLaVA's convention)."""


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """Token ids that frame an image in ``input_ids`` (Qwen2-VL's defaults).

    An image becomes ``<|vision_start|> <|image_pad|> x n <|vision_end|>``; the model puts
    the vision tower's ``n`` merged features at the ``<|image_pad|>`` positions.
    """

    vision_start_id: int = 151652
    vision_end_id: int = 151653
    image_pad_id: int = 151655

    @property
    def ids(self) -> frozenset[int]:
        return frozenset((self.vision_start_id, self.vision_end_id, self.image_pad_id))


@dataclass(frozen=True, slots=True)
class ImageSettings:
    """How images are resized and cut (the ``data.images`` config).

    Attributes:
        min_pixels: Smallest pixel count after the resize (Qwen2-VL: ``56 * 56``).
        max_pixels: Largest pixel count after the resize; it bounds one image's tokens
            (``max_pixels / 28**2``) and patches (``max_pixels / 14**2``).
        max_image_pixels: An image file with more pixels than this is refused before it
            is decoded (a decompression-bomb guard and a bad-input check).
        patch_size: ViT patch side in pixels.
        merge_size: Patches merged per side into one LLM token.
        temporal_patch_size: Frames per patch (a still image is repeated).
    """

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    max_image_pixels: int = 8192 * 8192
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        for name in ("min_pixels", "max_pixels", "max_image_pixels", "patch_size", "merge_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"images.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.temporal_patch_size, int) or self.temporal_patch_size < 1:
            raise ValueError(
                f"images.temporal_patch_size must be a positive integer, "
                f"got {self.temporal_patch_size!r}"
            )
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"images.min_pixels ({self.min_pixels}) must be <= images.max_pixels "
                f"({self.max_pixels})"
            )

    @property
    def patch_dim(self) -> int:
        """Values per patch row of ``pixel_values`` (3 channels x frames x patch area)."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The smart-resize target ``(height, width)`` of an image, the processor's own."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        factor = self.patch_size * self.merge_size
        return smart_resize(height, width, factor, self.min_pixels, self.max_pixels)

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """``(grid_t, grid_h, grid_w)`` of an image of ``height x width`` pixels."""
        resized_h, resized_w = self.resized(height, width)
        return 1, resized_h // self.patch_size, resized_w // self.patch_size


def image_token_count(grid_thw: Sequence[int] | torch.Tensor, merge_size: int = 2) -> int:
    """LLM tokens of one image: its patches over ``merge_size**2``."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (merge_size * merge_size)


class ImageProcessor:
    """``transformers``' Qwen2-VL image processor (PIL backend), built offline from
    :class:`ImageSettings` on first use (it pickles as its settings, for the workers)."""

    def __init__(self, settings: ImageSettings | None = None) -> None:
        self.settings = settings or ImageSettings()
        self._processor: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings, self._processor = state["settings"], None

    @property
    def processor(self) -> Any:
        if self._processor is None:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                Qwen2VLImageProcessorPil,
            )

            s = self.settings
            self._processor = Qwen2VLImageProcessorPil(
                min_pixels=s.min_pixels,
                max_pixels=s.max_pixels,
                patch_size=s.patch_size,
                merge_size=s.merge_size,
                temporal_patch_size=s.temporal_patch_size,
            )
        return self._processor

    def __call__(self, images: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``pixel_values`` float32 ``[patches, patch_dim]`` and ``image_grid_thw`` long
        ``[images, 3]``; empty (``[0, patch_dim]``, ``[0, 3]``) for no image."""
        if not images:
            empty = torch.zeros((0, self.settings.patch_dim), dtype=torch.float32)
            return empty, torch.zeros((0, 3), dtype=torch.long)
        out = self.processor(images=list(images), return_tensors="pt")
        return out["pixel_values"].to(torch.float32), out["image_grid_thw"].to(torch.long)


def load_image(path: str | Path, index: int | None, field: str, max_image_pixels: int) -> Any:
    """Open an image file as RGB, or raise :class:`BadSampleError` naming ``field``.

    The size is read from the header and checked against ``max_image_pixels`` before the
    pixels are decoded.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise BadSampleError(index, field, f"names no file: {str(path)!r}")
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > max_image_pixels:
                problem = (
                    f"is {width} x {height} = {width * height} pixels, more than "
                    f"images.max_image_pixels={max_image_pixels} ({path})"
                )
                raise BadSampleError(index, field, problem)
            if max(width, height) > 200 * min(width, height):
                problem = f"has aspect ratio {width}:{height}, beyond 200:1 ({path})"
                raise BadSampleError(index, field, problem)
            return image.convert("RGB")  # decodes the whole file
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        if isinstance(error, BadSampleError):
            raise
        problem = f"cannot be decoded as an image ({path}): {type(error).__name__}: {error}"
        raise BadSampleError(index, field, problem) from error


def expected_image_tokens(height: int, width: int, settings: ImageSettings) -> int:
    """LLM tokens the processor will give an image of ``height x width`` pixels."""
    return image_token_count(settings.grid(height, width), settings.merge_size)


def patch_count(grid_thw: torch.Tensor) -> int:
    """ViT patches of the images of ``grid_thw`` (``[images, 3]``)."""
    return int(grid_thw.prod(dim=-1).sum()) if grid_thw.numel() else 0


def mrope_positions(
    input_ids: torch.Tensor, grid_thw: torch.Tensor, image_pad_id: int, merge_size: int = 2
) -> torch.Tensor:
    """Rotary positions of one sample: long ``[4, L]``, the text positions ``0..L-1``
    then Qwen2-VL's temporal, height and width rows.

    The M-RoPE rows follow the model's ``get_rope_index``: text advances one position on
    every axis; the tokens of an image of ``t x h x w`` merged cells starting at ``p`` get
    ``(p + i_t, p + i_h, p + i_w)``, and the text after it resumes at ``p + max(h, w)``.

    Args:
        input_ids: ``[L]`` tokens; each image is one contiguous run of ``image_pad_id``
            of ``t * h * w / merge_size**2`` tokens, in the order of ``grid_thw``.
        grid_thw: ``[images, 3]`` patch grids.

    Raises:
        ValueError: The runs do not match the grids (count or length).
    """
    is_image = input_ids == image_pad_id
    length = input_ids.numel()
    rows = torch.empty((3, length), dtype=torch.long)
    change = (torch.nonzero(is_image[1:] != is_image[:-1]).flatten() + 1).tolist()
    current, image = 0, 0
    for start, end in zip([0, *change], [*change, length], strict=True):
        if not bool(is_image[start]):
            rows[:, start:end] = torch.arange(current, current + end - start)
            current += end - start
            continue
        if image >= len(grid_thw):
            raise ValueError(f"image run {image} at token {start} has no image_grid_thw row")
        t, h, w = (int(x) for x in grid_thw[image])
        h, w = h // merge_size, w // merge_size
        if t * h * w != end - start:
            raise ValueError(
                f"image {image} has {t * h * w} merged cells but a run of {end - start} "
                "image tokens"
            )
        cells = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        rows[:, start:end] = torch.stack(cells).reshape(3, -1) + current
        current += max(h, w)
        image += 1
    if image != len(grid_thw):
        raise ValueError(f"{len(grid_thw)} image_grid_thw rows but {image} runs of image tokens")
    return torch.cat([torch.arange(length).unsqueeze(0), rows])
