"""``VisionDataModule``: image-text conversations, processed in the loader workers.

Everything but the source is :class:`~odb_lightning.lit.data.datamodule.ODBDataModule`'s
(batching modes, sharding, resume, reporting); the samples carry their images
(:class:`~odb_lightning.data.vision_dataset.VisionChatDataset`) and every collate of the
runtime batches them (:mod:`odb_lightning.runtime.vlm_batch`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset
from typing_extensions import override

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import ImageExtent
from odb_lightning.data.config import DataSource
from odb_lightning.data.sizes import records_to_read
from odb_lightning.data.sources.table import SourceKind, resolve
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.data.vision import ImageSettings
from odb_lightning.data.vision_dataset import VisionChatDataset
from odb_lightning.data.vision_family import vision_family_of
from odb_lightning.lit.data.chat_source import ChatSource
from odb_lightning.lit.data.datamodule import ODBDataModule


class VisionDataModule(ODBDataModule):
    """Image-text data for a model of a vision family
    (:mod:`odb_lightning.data.vision_family`; its ids are the tokenizer's own).

    Args:
        tokenizer, batching, source: As :class:`ODBDataModule`'s; the source is an
            image-text source of the source table (``llava_jsonl``: your
            file; ``llava``, ``sharegpt4o``: a set written once under
            ``caches.image_set_dir``, ``sizes.max_samples`` records, 512 when unset).
        images: Resize and patch settings (:class:`~odb_lightning.data.vision.ImageSettings`
            fields); they must match the model's vision tower.
        **kwargs: The other :class:`ODBDataModule` arguments (``sizes``, ``caches``,
            ``run``, ...).
    """

    KINDS = (SourceKind.IMAGE_CHAT,)

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        batching: BatchingConfig,
        source: DataSource | None = None,
        images: ImageSettings | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        source = source if source is not None else DataSource("llava")
        if source.augmentation is not None:
            raise ValueError("data.source.augmentation is not supported for image-text sources")
        super().__init__(tokenizer, batching, source, **kwargs)
        self.images = (
            images if isinstance(images, ImageSettings) else ImageSettings(**(images or {}))
        )
        self.family = vision_family_of(tokenizer)  # the tokenizer's own ids
        self._image_file: Path | None = None  # the JSON Lines file read (located at setup)
        if not self.entry.needs_path and self.caches.image_set_dir is None:
            raise ValueError(
                f"data.source.name={self.source.name} needs data.caches.image_set_dir: "
                "where the set is written"
            )

    @override
    def largest_image(self) -> ImageExtent:
        """The largest image the resize makes (``data.images.max_pixels``): the memory
        warm-up checks steps of it."""
        return ImageExtent(self.images.largest_grid, self.images.merge_size)

    @override
    def _chat_source(self) -> ChatSource:
        """The source with its JSON Lines file located (a written set is written first,
        once)."""
        if self._image_file is None:
            max_samples = records_to_read(self.sizes.max_samples)
            request = super()._chat_source().request("raise", max_samples)
            self._image_file = resolve(self.entry.image_file)(request)
        source = replace(self.source, path=str(self._image_file))
        return ChatSource(source, self.sizes.max_samples, self.batching.seed)

    @override
    def _load_dataset(self) -> Dataset:
        records = self._read_records()
        image_root = self.source.image_root or self._image_file.parent
        return VisionChatDataset(
            records,
            self.tokenizer,
            self.max_seq_len,
            images=self.images,
            family=self.family,
            image_root=image_root,
            system_prompt=self.source.system_prompt,
        )
