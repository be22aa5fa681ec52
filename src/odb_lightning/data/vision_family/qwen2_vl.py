"""The Qwen2-VL family: ``<|vision_start|>``, ``<|vision_end|>`` and ``<|image_pad|>``,
``transformers``' own image processor (PIL backend) and its smart resize, M-RoPE (the
model's ``get_rope_index``) and ``Qwen2VLConfig``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from odb_lightning.data.tokenizer import IMAGE_PAD, VISION_END, VISION_START, SpecialTokens
from odb_lightning.data.vision import ImageSettings, VisionTokens, VisionTower
from odb_lightning.data.vision_family.contract import DUMMY_GRID, PatchLayout, VisionFamily


def default_mrope_section(head_dim: int) -> list[int]:
    """Rotary frequency pairs per axis (temporal, height, width) in Qwen2-VL's 1:1.5:1.5
    proportion (``[16, 24, 24]`` for its 128-wide heads)."""
    half = head_dim // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    return [half - 2 * spatial, spatial, spatial]


class ImageProcessor:
    """``transformers``' Qwen2-VL image processor (PIL backend), built offline from
    :class:`~odb_lightning.data.vision.ImageSettings` on first use (it pickles as its
    settings, for the workers)."""

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

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The smart-resize target ``(height, width)`` of an image, the processor's own."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        s = self.settings
        return smart_resize(height, width, s.patch_size * s.merge_size, s.min_pixels, s.max_pixels)

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """``(grid_t, grid_h, grid_w)`` of an image of ``height x width`` pixels."""
        resized_h, resized_w = self.resized(height, width)
        return 1, resized_h // self.settings.patch_size, resized_w // self.settings.patch_size

    def __call__(self, images: Sequence[Any]) -> tuple[Tensor, Tensor]:
        """``pixel_values`` float32 ``[patches, patch_dim]`` and ``image_grid_thw`` long
        ``[images, 3]``; empty (``[0, patch_dim]``, ``[0, 3]``) for no image."""
        if not images:
            empty = torch.zeros((0, self.settings.patch_dim), dtype=torch.float32)
            return empty, torch.zeros((0, 3), dtype=torch.long)
        out = self.processor(images=list(images), return_tensors="pt")
        return out["pixel_values"].to(torch.float32), out["image_grid_thw"].to(torch.long)


def mrope_positions(
    input_ids: Tensor, grid_thw: Tensor, image_pad_id: int, merge_size: int = 2
) -> Tensor:
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


@dataclass(frozen=True)
class Qwen2VLFamily(VisionFamily):
    """Qwen2-VL's specifics (see the module docstring).

    Args:
        tokens: The ids that frame an image, the tokenizer's (:meth:`of_tokenizer`).
    """

    name: ClassVar[str] = "qwen2_vl"
    tokens: VisionTokens

    @classmethod
    def of_tokenizer(cls, tokenizer: object) -> Qwen2VLFamily:
        """The family with the tokenizer's own ``<|vision_start|>``, ``<|vision_end|>`` and
        ``<|image_pad|>`` ids.

        Raises:
            ValueError: The tokenizer names no special tokens, or lacks one of these.
        """
        if not isinstance(tokenizer, SpecialTokens):
            raise ValueError(
                f"{type(tokenizer).__name__} names no special tokens: image-text data reads "
                f"{VISION_START}, {VISION_END} and {IMAGE_PAD} from the tokenizer "
                "(tokenizer=qwen2, or tokenizer=hf with a Qwen2-VL tokenizer)"
            )
        return cls(
            VisionTokens(
                vision_start_id=tokenizer.special_token_id(VISION_START),
                vision_end_id=tokenizer.special_token_id(VISION_END),
                image_pad_id=tokenizer.special_token_id(IMAGE_PAD),
            )
        )

    def image_processor(self, settings: ImageSettings) -> ImageProcessor:
        """The image processor of ``settings`` (``data.images``)."""
        return ImageProcessor(settings)

    def positions(self, input_ids: Tensor, grid_thw: Tensor, merge_size: int) -> Tensor:
        """The sample's ``[4, L]`` rotary positions (:func:`mrope_positions`)."""
        return mrope_positions(input_ids, grid_thw, self.tokens.image_pad_id, merge_size)

    def model_config(self, text: Any, tower: VisionTower, fold: int | None) -> Any:
        """The ``Qwen2VLConfig`` of a random init: the text model of ``text`` (a causal-LM
        config), ``tower``, and the vision ids (the last three of a ``fold``-token
        vocabulary when ids are folded).

        Raises:
            ValueError: ``text`` is not a Qwen2 language model, or ``mrope_section`` does
                not sum to half the head width.
        """
        from transformers import Qwen2VLConfig

        if text.model_type != "qwen2":
            raise ValueError(
                f"model.architecture.model_type={text.model_type}: the Qwen2-VL family's "
                "language model is qwen2"
            )
        ids = self.tokens
        vision_ids = (ids.image_pad_id, ids.vision_start_id, ids.vision_end_id)
        model_ids = [fold - 1 - k for k in range(3)] if fold is not None else list(vision_ids)
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        section = list(tower.mrope_section or default_mrope_section(head_dim))
        if sum(section) != head_dim // 2:
            raise ValueError(
                f"model.vision.mrope_section {section} must sum to head_dim / 2 = {head_dim // 2}"
            )
        rope = {"rope_type": "default", "rope_theta": tower.rope_theta, "mrope_section": section}
        text_config = text.to_dict() | {"rope_parameters": rope}
        for key in ("architectures", "model_type", "transformers_version", "rope_scaling"):
            text_config.pop(key, None)
        vision_config = {
            "depth": tower.depth,
            "embed_dim": tower.embed_dim,
            "num_heads": tower.num_heads,
            "mlp_ratio": tower.mlp_ratio,
            "hidden_size": text.hidden_size,
            "patch_size": tower.patch_size,
            "spatial_merge_size": tower.spatial_merge_size,
            "temporal_patch_size": tower.temporal_patch_size,
        }
        return Qwen2VLConfig(
            text_config=text_config,
            vision_config=vision_config,
            image_token_id=model_ids[0],
            vision_start_token_id=model_ids[1],
            vision_end_token_id=model_ids[2],
            tie_word_embeddings=text.tie_word_embeddings,
        )

    def patch_layout(self, model: nn.Module) -> PatchLayout:
        """The patch row width and merge size of ``model.config.vision_config``."""
        config = model.config.vision_config
        patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
        return PatchLayout(patch_dim, config.spatial_merge_size)

    @staticmethod
    def multimodal_body(model: nn.Module) -> nn.Module:
        """The model's vision tower + language model (``Qwen2VLModel``), under LoRA too."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        return base.model

    def dummy_vision_loss(self, model: nn.Module) -> Tensor:
        """The vision tower on a zero image of :data:`DUMMY_GRID`, summed, times 0: a loss
        term that is 0 and reaches every vision parameter."""
        visual = self.multimodal_body(model).visual
        patch_dim = self.patch_layout(model).patch_dim
        t, h, w = DUMMY_GRID
        device = next(visual.parameters()).device
        pixels = torch.zeros((t * h * w, patch_dim), dtype=visual.dtype, device=device)
        grid = torch.tensor([DUMMY_GRID], dtype=torch.long, device=device)
        out = visual(pixels, grid_thw=grid)
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        return features.sum() * 0.0
