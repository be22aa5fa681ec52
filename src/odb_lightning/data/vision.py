"""Images as an image-text model sees them: read, checked, resized and cut into patches.

The image processor is the vision family's
(:meth:`~odb_lightning.data.vision_family.VisionFamily.image_processor`). The default
family's, at these settings' defaults, resizes an image to multiples of
``patch_size * merge_size`` (28 px) with its pixel count kept within
``[min_pixels, max_pixels]`` ("smart resize") and cuts it into
``grid_t x grid_h x grid_w`` patches of 14 x 14 px (``grid_t = 1`` for a still image;
each patch row holds ``temporal_patch_size`` copies, ``3 * 2 * 14 * 14 = 1176`` values).
The vision tower sees every patch; the merger joins ``merge_size x merge_size``
neighbours into one LLM token, so an image costs ``grid_t * grid_h * grid_w / 4`` tokens
in ``input_ids`` (:func:`image_token_count`) and ``grid_t * grid_h * grid_w`` ViT patches.
The vision tower of a random init (:class:`VisionTower`, ``model.vision``) takes these
patches, so its patch settings sit here beside the images'. Importing this module loads
no torch: the config is checked before torch loads (``odb-check``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the config is validated before torch loads
    import torch

IMAGE_PLACEHOLDER = "<image>"
"""Marks where an image goes in a user turn (LLaVA's convention)."""


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """Token ids that frame an image in ``input_ids``, the tokenizer's
    (:func:`~odb_lightning.data.vision_family.vision_family_of`).

    An image becomes ``<|vision_start|> <|image_pad|> x n <|vision_end|>``; the model puts
    the vision tower's ``n`` merged features at the ``<|image_pad|>`` positions.
    """

    vision_start_id: int
    vision_end_id: int
    image_pad_id: int

    @property
    def ids(self) -> frozenset[int]:
        return frozenset((self.vision_start_id, self.vision_end_id, self.image_pad_id))


@dataclass(frozen=True, slots=True)
class ImageSettings:
    """How images are resized and cut (the ``data.images`` config).

    Attributes:
        min_pixels: Smallest pixel count after the resize.
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

    @property
    def largest_grid(self) -> tuple[int, int, int]:
        """The ``(t, h, w)`` patch grid of the largest image the resize makes: sides in
        whole merged cells (``patch_size x merge_size`` pixels), as many cells as
        ``max_pixels`` holds, the most square such grid."""
        side = self.patch_size * self.merge_size
        cells = max(1, self.max_pixels // (side * side))
        most = max(a * (cells // a) for a in range(1, math.isqrt(cells) + 1))
        short = max(a for a in range(1, math.isqrt(cells) + 1) if a * (cells // a) == most)
        return 1, short * self.merge_size, (most // short) * self.merge_size

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


def image_token_count(grid_thw: Sequence[int] | torch.Tensor, merge_size: int = 2) -> int:
    """LLM tokens of one image: its patches over ``merge_size**2``."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (merge_size * merge_size)


def load_image(path: str | Path, index: int | None, field: str, max_image_pixels: int) -> Any:
    """Open an image file as RGB, or raise :class:`BadSampleError` naming ``field``.

    The size is read from the header and checked against ``max_image_pixels`` before the
    pixels are decoded.
    """
    from PIL import Image, UnidentifiedImageError

    from odb_lightning.sample import BadSampleError  # with torch: the samples' contract

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


@dataclass(frozen=True)
class VisionTower:
    """The vision tower of a random init (``model.vision``); its patch settings must match
    the data's ``images``."""

    depth: int = 2
    """Vision transformer blocks."""
    embed_dim: int = 32
    """Their width."""
    num_heads: int = 2
    """Their attention heads."""
    mlp_ratio: int = 2
    """MLP width over ``embed_dim``."""
    patch_size: int = 14
    """ViT patch side in pixels (``data.images.patch_size``)."""
    spatial_merge_size: int = 2
    """Patches merged per side into one LLM token (``data.images.merge_size``)."""
    temporal_patch_size: int = 2
    """Frames per patch."""
    mrope_section: tuple[int, ...] | None = None
    """Rotary frequency pairs per axis (temporal, height, width); ``None``: the family's
    own proportion."""
    rope_theta: float = 1_000_000.0
    """Rotary base of the language model."""

    def __post_init__(self) -> None:
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        sizes = ("depth", "embed_dim", "num_heads", "mlp_ratio", "patch_size")
        for name in (*sizes, "spatial_merge_size", "temporal_patch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.vision.{name} must be an integer >= 1, got {value!r}")
