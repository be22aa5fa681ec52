"""A ShareGPT4o-shaped mix offline: text-only chats and image conversations in one set.

ShareGPT4o mixes text-only conversations with image ones of very different resolutions,
which gives it a wide length spread. :func:`build_sharegpt4o_set` takes the text-only
part from ShareGPT's first exchanges (the real chat corpus of the text sources) and the
image part from easy-VQA pictures and questions, each picture written at a resolution
drawn from a wide :class:`~odb_lightning.data.image_generator.ResolutionProfile`; the two
are interleaved by a seeded coin.
"""

from __future__ import annotations

import random
from pathlib import Path

from odb_lightning.data.image_generator import ResolutionProfile, write_images
from odb_lightning.data.sources.llava import (
    DEFAULT_SET_SAMPLES,
    easy_vqa_conversations,
    image_conversation,
    write_jsonl,
)
from odb_lightning.data.sources.sharegpt import sharegpt_records
from odb_lightning.data.sources.table import SourceRequest

SHAREGPT4O_RESOLUTIONS = ResolutionProfile(mean_pixels=400_000, cv=2.0)
"""From thumbnails to large screenshots: a heavy tail of pixel counts (many small images,
some past the processor's ``max_pixels``), which with the text-only half gives the set a
length CV near ShareGPT4o's (``experiments/vlm/README.md``)."""


def build_sharegpt4o_set(
    out_dir: str | Path,
    num_samples: int,
    seed: int = 0,
    image_fraction: float = 0.5,
    resolutions: ResolutionProfile = SHAREGPT4O_RESOLUTIONS,
) -> Path:
    """Write the mix under ``out_dir``: ``sharegpt4o_*.jsonl`` and its images.

    Args:
        image_fraction: Chance that a record is an image conversation.

    Returns:
        The JSON Lines path (image paths relative to ``out_dir``).
    """
    if not 0.0 <= image_fraction <= 1.0:
        raise ValueError(f"image_fraction must be in [0, 1], got {image_fraction}")
    out_dir = Path(out_dir)
    coin = random.Random(seed)
    with_image = [coin.random() < image_fraction for _ in range(num_samples)]
    num_images = sum(with_image)
    items = easy_vqa_conversations(seed)[:num_images]
    texts = sharegpt_records(regime="first_exchange", max_samples=num_samples - num_images)
    if len(items) < num_images or len(texts.records) < num_samples - num_images:
        raise ValueError(f"not enough source records for {num_samples} samples")
    sizes = resolutions.draw(num_images, seed)
    images = iter(
        write_images([p for p, _ in items], sizes, out_dir / "images", f"sharegpt4o_{seed}_")
    )
    conversations, chats = iter(items), iter(texts.records)
    turns = random.Random(seed + 1)
    records = []
    for k, image_record in enumerate(with_image):
        if image_record:
            _, qa = next(conversations)
            messages = image_conversation(qa, turns.randint(1, 4))
            paths = [str(next(images).relative_to(out_dir))]
        else:
            messages, paths = list(next(chats)["messages"]), []
        records.append({"id": f"sharegpt4o-{k}", "images": paths, "messages": messages})
    return write_jsonl(records, out_dir / f"sharegpt4o_{seed}_{num_samples}.jsonl")


def written_set(request: SourceRequest) -> Path:
    """``sharegpt4o``: the mix written (once) under ``set_dir``, ``max_samples`` records
    (512 when unset), drawn by the seed."""
    count = request.max_samples or DEFAULT_SET_SAMPLES
    return build_sharegpt4o_set(request.set_dir, count, seed=request.seed)
