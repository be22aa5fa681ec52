"""``VisionDataModule``: image-text conversations, processed in the loader workers.

Everything but the source is :class:`~odb_lightning.lit.data.datamodule.ODBDataModule`'s
(batching modes, sharding, resume, reporting); the samples carry their images
(:class:`~odb_lightning.data.vision_dataset.VisionChatDataset`) and every collate of the
runtime batches them (:mod:`odb_lightning.runtime.vlm_batch`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset
from typing_extensions import override

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import ImageExtent
from odb_lightning.data.sizes import records_to_read
from odb_lightning.data.sources.llava import build_llava_set, llava_source
from odb_lightning.data.sources.sharegpt4o import build_sharegpt4o_set
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.data.vision import ImageSettings
from odb_lightning.data.vision_dataset import VisionChatDataset
from odb_lightning.data.vision_family import Qwen2VLFamily
from odb_lightning.lit.data.chat_source import keep_records
from odb_lightning.lit.data.datamodule import ODBDataModule


class VisionSource(StrEnum):
    """Image-text sources: your LLaVA-style JSON Lines file, or a set written offline."""

    LLAVA_JSONL = "llava_jsonl"
    LLAVA = "llava"
    SHAREGPT4O = "sharegpt4o"


DEFAULT_SET_SAMPLES = 512
"""Records of a written set when ``max_samples`` is unset."""


class VisionDataModule(ODBDataModule):
    """Image-text data for a Qwen2-VL-family model.

    Args:
        source: ``llava_jsonl`` (``path``: your file, images under ``image_root`` or
            its directory), ``llava`` or ``sharegpt4o`` (a LLaVA- or ShareGPT4o-shaped
            set written once under ``set_dir``, ``max_samples`` records, 512 when unset;
            a fraction keeps that share of the 512).
        images: Resize and patch settings (:class:`~odb_lightning.data.vision.ImageSettings`
            fields); they must match the model's vision tower.
        image_root: Directory of relative image paths (``llava_jsonl``).
        set_dir: Where ``llava`` and ``sharegpt4o`` are written.
        **kwargs: :class:`ODBDataModule` arguments (``max_seq_len``, ``max_samples``,
            ``val_samples``, ``system_prompt``, ``length_cache_dir``, ...).
    """

    def __init__(
        self,
        source: str,
        tokenizer: ChatTokenizer,
        batching: BatchingConfig,
        *,
        images: ImageSettings | dict[str, Any] | None = None,
        image_root: str | None = None,
        set_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            self.vision_source = VisionSource(source)
        except ValueError:
            choices = ", ".join(s.value for s in VisionSource)
            raise ValueError(f"data.source must be one of {choices}, got {source!r}") from None
        if kwargs.get("augmentation") is not None:
            raise ValueError("data.augmentation is not supported for image-text sources")
        super().__init__(source, tokenizer, batching, **kwargs)
        self.images = (
            images if isinstance(images, ImageSettings) else ImageSettings(**(images or {}))
        )
        # The ids that frame an image are the tokenizer's own.
        self.family = Qwen2VLFamily.of_tokenizer(tokenizer)
        self.image_root, self.set_dir = image_root, set_dir
        if self.vision_source is VisionSource.LLAVA_JSONL and self.path is None:
            raise ValueError("data.source=llava_jsonl needs data.path: a JSON Lines file")
        if self.vision_source is not VisionSource.LLAVA_JSONL and set_dir is None:
            raise ValueError(f"data.source={source} needs data.set_dir: where it is written")

    @override
    def largest_image(self) -> ImageExtent:
        """The largest image the resize makes (``data.images.max_pixels``): the memory
        warm-up checks steps of it."""
        return ImageExtent(self.images.largest_grid, self.images.merge_size)

    def records_path(self) -> Path:
        """The JSON Lines file of the source (a written set is written first)."""
        if self.vision_source is VisionSource.LLAVA_JSONL:
            return Path(self.path)
        count = records_to_read(self.max_samples) or DEFAULT_SET_SAMPLES
        build = (
            build_llava_set if self.vision_source is VisionSource.LLAVA else build_sharegpt4o_set
        )
        return build(self.set_dir, count, seed=self.batching.seed)

    @override
    def _load_dataset(self) -> Dataset:
        path = self.records_path()
        source = llava_source(
            path,
            max_samples=records_to_read(self.max_samples),
            on_bad_record=self.batching.loader.on_bad_sample.value,
        )
        records = self.record_cache.records(source)
        kept, self.source_counts = keep_records(records.records, records.counts, self.max_samples)
        self.source_rejected = list(records.rejected)
        self._note_partial_read(len(kept))
        return VisionChatDataset(
            kept,
            self.tokenizer,
            self.max_seq_len,
            images=self.images,
            family=self.family,
            image_root=self.image_root or path.parent,
            system_prompt=self.system_prompt,
        )
