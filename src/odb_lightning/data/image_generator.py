"""Image files with a controlled resolution distribution, for offline VLM benchmark sets.

A dynamic-resolution VLM's sample cost is set by its image's resolution, so a benchmark
set needs the resolution spread of real data, not of its source images. Resolutions are
drawn as a lognormal pixel count (by mean and CV) times an aspect ratio drawn from
common photo shapes; the picture itself is a real one (e.g. an easy-VQA scene) resized
to that resolution and written as JPEG, so the loader reads, decodes and resizes real
files as it would in production.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

COMMON_ASPECTS = (1.0, 4 / 3, 3 / 4, 16 / 9, 9 / 16, 3 / 2, 2 / 3)
"""Width / height of common photographs and screenshots."""


@dataclass(frozen=True, slots=True)
class ResolutionProfile:
    """A distribution of image resolutions.

    Attributes:
        mean_pixels: Mean pixel count (width x height).
        cv: Coefficient of variation of the pixel count (lognormal).
        min_side: Smallest width or height drawn.
        max_pixels: Pixel counts are clipped to this.
        aspects: Width / height ratios, drawn uniformly.
    """

    mean_pixels: float
    cv: float
    min_side: int = 32
    max_pixels: int = 4096 * 4096
    aspects: tuple[float, ...] = COMMON_ASPECTS

    def __post_init__(self) -> None:
        if self.mean_pixels <= 0 or self.cv < 0:
            raise ValueError(f"need mean_pixels > 0 and cv >= 0, got {self}")
        if not self.aspects or min(self.aspects) <= 0:
            raise ValueError(f"aspects must be positive ratios, got {self.aspects}")

    def draw(self, count: int, seed: int) -> list[tuple[int, int]]:
        """``count`` seeded ``(width, height)`` pairs."""
        rng = random.Random(seed)
        sigma = math.sqrt(math.log1p(self.cv**2))
        mu = math.log(self.mean_pixels) - sigma**2 / 2
        sizes = []
        for _ in range(count):
            pixels = min(rng.lognormvariate(mu, sigma), self.max_pixels)
            aspect = rng.choice(self.aspects)
            width = max(self.min_side, round(math.sqrt(pixels * aspect)))
            height = max(self.min_side, round(math.sqrt(pixels / aspect)))
            sizes.append((width, height))
        return sizes


def write_resized(source: str | Path, target: Path, size: tuple[int, int]) -> Path:
    """``source`` resized to ``size`` (width, height), written to ``target`` as JPEG."""
    from PIL import Image

    with Image.open(source) as image:
        resized = image.convert("RGB").resize(size, Image.Resampling.BILINEAR)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written whole, then renamed: every rank of a job may write the same set at once.
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    resized.save(partial, format="JPEG", quality=85)
    os.replace(partial, target)
    return target


def write_images(
    sources: Sequence[str | Path], sizes: Sequence[tuple[int, int]], out_dir: Path, prefix: str
) -> list[Path]:
    """``sources[k]`` at ``sizes[k]`` into ``out_dir/{prefix}{k}.jpg`` (existing files of
    the right size are kept, so a set is written once)."""
    from PIL import Image

    paths = []
    for k, (source, size) in enumerate(zip(sources, sizes, strict=True)):
        target = out_dir / f"{prefix}{k}.jpg"
        if target.is_file():
            with Image.open(target) as existing:
                if existing.size == tuple(size):
                    paths.append(target)
                    continue
        paths.append(write_resized(source, target, size))
    return paths
