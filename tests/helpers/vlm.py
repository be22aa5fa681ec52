"""Image-text test data: images of exact sizes on disk, records, and a tiny float64 Qwen2-VL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from helpers.tiny_lm import module_arguments
from odb_lightning.data.vision import ImageSettings, VisionTokens, VisionTower
from odb_lightning.data.vision_family import Qwen2VLFamily
from odb_lightning.lit.model.vlm_module import VisionLanguageModule

SMALL_IMAGES = ImageSettings(min_pixels=56 * 56, max_pixels=112 * 112)
"""At most 16 LLM tokens (64 patches) per image: fast model tests."""


def write_image(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A seeded noise picture of exactly ``width x height`` pixels, as PNG."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.numpy()).save(path)
    return path


def image_record(record_id: str, images: Sequence[str], questions: Sequence[str]) -> dict:
    """One user turn per image (``<image>`` first), each answered."""
    messages: list[dict[str, str]] = []
    for k, question in enumerate(questions):
        prompt = f"<image>\n{question}" if k < len(images) else question
        messages += [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": f"answer {k} to {question}"},
        ]
    return {"id": record_id, "images": list(images), "messages": messages}


def write_records(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


FAMILY = Qwen2VLFamily(VisionTokens(vision_start_id=998, vision_end_id=999, image_pad_id=997))
"""Qwen2-VL with the vision ids of :func:`tiny_vlm`, inside its 1000-token vocabulary."""


def tiny_vlm_arguments(**overrides: Any) -> dict[str, Any]:
    """A tiny float64 Qwen2-VL with a 1000-token vocabulary and the vision ids inside it;
    ``overrides`` are flat knobs (``vision_<field>`` for the tower's fields, the rest as
    :func:`~helpers.tiny_lm.module_arguments` routes them)."""
    knobs: dict[str, Any] = (
        dict(
            vocab_size=1000,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            model_dtype="float64",
            vision_depth=2,
            vision_embed_dim=32,
            vision_num_heads=2,
        )
        | overrides
    )
    names = [k for k in knobs if k.startswith("vision_")]
    tower = {k.removeprefix("vision_"): knobs.pop(k) for k in names}
    return module_arguments(**knobs) | {
        "vision": VisionTower(**tower),
        "family": FAMILY,
    }


def tiny_vlm(**overrides: Any) -> VisionLanguageModule:
    torch.manual_seed(0)
    module = VisionLanguageModule(**tiny_vlm_arguments(**overrides))
    module.configure_model()
    return module


def model_sample(
    image_sizes: Sequence[tuple[int, int]],
    prompt: int,
    answer: int,
    seed: int,
    settings: ImageSettings = SMALL_IMAGES,
    vocab: int = 997,
) -> dict[str, torch.Tensor]:
    """An image-text sample for :func:`tiny_vlm`: ``prompt`` random tokens, each image's
    block (ids 998, 997 x n, 999), then ``answer`` supervised random tokens."""
    from PIL import Image

    from odb_lightning.data.vision import image_token_count
    from odb_lightning.data.vision_family import ImageProcessor, mrope_positions

    generator = torch.Generator().manual_seed(seed)
    pictures = [
        Image.fromarray(
            torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8).numpy()
        )
        for w, h in image_sizes
    ]
    pixel_values, grid_thw = ImageProcessor(settings)(pictures)
    ids = torch.randint(0, vocab, (prompt,), generator=generator).tolist()
    for grid in grid_thw:
        ids += [998, *[997] * image_token_count(grid, settings.merge_size), 999]
    unsupervised = len(ids)
    ids += torch.randint(0, vocab, (answer,), generator=generator).tolist()
    input_ids = torch.tensor(ids)
    labels = input_ids.clone()
    labels[:unsupervised] = -100
    return {
        "input_ids": input_ids,
        "labels": labels,
        "pixel_values": pixel_values,
        "image_grid_thw": grid_thw,
        "position_ids": mrope_positions(input_ids, grid_thw, 997, settings.merge_size),
    }
