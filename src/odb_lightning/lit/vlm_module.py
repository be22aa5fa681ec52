"""Vision-language LightningModule: a Qwen2-VL model trained with the token-weighted loss.

The batch carries ``pixel_values`` and ``image_grid_thw`` beside the tokens and the 3-D
rotary ``position_ids`` (:mod:`odb_lightning.runtime.vlm_batch`); the model's own
multimodal body (vision tower, merger, language model) turns them into hidden states and
the chunked LM head scores the supervised positions, as in
:class:`~odb_lightning.lit.module.CausalLMModule`. Image tokens are never supervised.

**The vision tower runs on every rank at every step.** A batch without an image (a
text-only group, or an IDLE step's dummy) runs the tower on a tiny dummy image of zeros
and adds its output times 0 to the loss: every vision parameter then takes part in
every forward and backward, so DDP's gradient all-reduce, FSDP2's per-module
all-gathers and reduce-scatters and ZeRO-3's parameter gathers are issued in the same
order on every rank, and the dummy changes no gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import Qwen2VLConfig
from typing_extensions import override

from odb_lightning.core.nodes import plain
from odb_lightning.data.vision import VisionTokens
from odb_lightning.lit.lm_head import chunked_lm_loss
from odb_lightning.lit.module import CausalLMModule
from odb_lightning.sample import IGNORE_INDEX, IMAGE_GRID_THW, PIXEL_VALUES

NOT_MODEL_INPUTS = ("labels", "cu_seqlens", "max_seqlen")
DUMMY_GRID = (1, 2, 2)
"""The dummy image's patch grid: one merge window, the smallest image the tower takes."""


def default_mrope_section(head_dim: int) -> list[int]:
    """Rotary frequency pairs per axis (temporal, height, width) in Qwen2-VL's 1:1.5:1.5
    proportion (``[16, 24, 24]`` for its 128-wide heads)."""
    half = head_dim // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    return [half - 2 * spatial, spatial, spatial]


def fold_vlm_ids(
    inputs: Mapping[str, Tensor], fold: int, vision_ids: Sequence[int]
) -> dict[str, Tensor]:
    """Token ids folded into a ``fold``-token vocabulary that keeps the vision ids apart:
    ``vision_ids[k]`` becomes ``fold - 1 - k``, every other id ``id % (fold - k_max)``."""
    folded = dict(inputs)
    reserved = len(vision_ids)

    def fold_ids(ids: Tensor) -> Tensor:
        out = ids.remainder(fold - reserved)
        for k, vision_id in enumerate(vision_ids):
            out = torch.where(ids == vision_id, fold - 1 - k, out)
        return out

    folded["input_ids"] = fold_ids(inputs["input_ids"])
    labels = inputs["labels"]
    folded["labels"] = torch.where(labels == IGNORE_INDEX, labels, fold_ids(labels))
    return folded


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
    """Rotary frequency pairs per axis (temporal, height, width); ``None``: Qwen2-VL's
    1:1.5:1.5 proportion."""
    rope_theta: float = 1_000_000.0
    """Rotary base of the language model."""

    def __post_init__(self) -> None:
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        for name in ("depth", "embed_dim", "num_heads", "mlp_ratio", "patch_size",
                     "spatial_merge_size", "temporal_patch_size"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.vision.{name} must be an integer >= 1, got {value!r}")


class VisionLanguageModule(CausalLMModule):
    """A Qwen2-VL model (random init from ``architecture`` and ``vision``, or the
    architecture's ``pretrained_path``).

    Args:
        vision: The vision tower of a random init.
        vision_tokens: The ids that frame an image (the tokenizer's).
        **parts: :class:`~odb_lightning.lit.module.CausalLMModule` arguments (the text
            model and the training settings).
    """

    def __init__(
        self, *, vision: VisionTower | None = None, vision_tokens: VisionTokens | None = None,
        **parts: Any,
    ) -> None:  # fmt: skip
        # Before the base's constructor, which saves hyperparameters() (plain values: no
        # nn.Module state is needed to hold them).
        self.vision = vision or VisionTower()
        self.vision_tokens = vision_tokens or VisionTokens()
        vision, vision_tokens = self.vision, self.vision_tokens
        super().__init__(**parts)
        fold = self.token_id_fold
        if fold is not None and fold < 4:
            raise ValueError(
                f"model.architecture.token_id_fold must leave room for the 3 vision ids, got {fold}"
            )
        vision_ids = (
            vision_tokens.image_pad_id,
            vision_tokens.vision_start_id,
            vision_tokens.vision_end_id,
        )
        self.vision_ids = vision_ids
        model_ids = [fold - 1 - k for k in range(3)] if fold is not None else list(vision_ids)
        base = self.random_init  # the text model's config, from CausalLMModule
        head_dim = base.hidden_size // base.num_attention_heads
        section = list(vision.mrope_section or default_mrope_section(head_dim))
        if sum(section) != head_dim // 2:
            raise ValueError(
                f"model.vision.mrope_section {section} must sum to head_dim / 2 = {head_dim // 2}"
            )
        text_config = base.to_dict() | {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": vision.rope_theta,
                "mrope_section": section,
            },
        }
        for key in ("architectures", "model_type", "transformers_version", "rope_scaling"):
            text_config.pop(key, None)
        self.random_init = Qwen2VLConfig(
            text_config=text_config,
            vision_config={
                "depth": vision.depth,
                "embed_dim": vision.embed_dim,
                "num_heads": vision.num_heads,
                "mlp_ratio": vision.mlp_ratio,
                "hidden_size": base.hidden_size,
                "patch_size": vision.patch_size,
                "spatial_merge_size": vision.spatial_merge_size,
                "temporal_patch_size": vision.temporal_patch_size,
            },
            image_token_id=model_ids[0],
            vision_start_token_id=model_ids[1],
            vision_end_token_id=model_ids[2],
            tie_word_embeddings=base.tie_word_embeddings,
        )

    @override
    def hyperparameters(self) -> dict[str, Any]:
        return super().hyperparameters() | {
            "vision": plain(self.vision),
            "vision_tokens": plain(self.vision_tokens),
        }

    def multimodal_body(self) -> Any:
        """The model's vision tower + language model (``Qwen2VLModel``), under LoRA too."""
        model = self.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        return base.model

    def dummy_vision_loss(self) -> Tensor:
        """The vision tower on a zero image of :data:`DUMMY_GRID`, summed, times 0: a loss
        term that is 0 and reaches every vision parameter."""
        visual = self.multimodal_body().visual
        config = self.model.config.vision_config
        patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
        t, h, w = DUMMY_GRID
        device = next(visual.parameters()).device
        pixels = torch.zeros((t * h * w, patch_dim), dtype=visual.dtype, device=device)
        grid = torch.tensor([DUMMY_GRID], dtype=torch.long, device=device)
        out = visual(pixels, grid_thw=grid)
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        return features.sum() * 0.0

    @override
    def forward(self, inputs: Mapping[str, Tensor], meta: Any = None) -> tuple[Tensor, int]:
        """Summed token cross-entropy of an image-text batch and its supervised tokens.

        With the step's ``meta`` (a batch of this package's collates, right padded) the
        padded batch runs without its attention mask, as in
        :class:`~odb_lightning.lit.module.CausalLMModule`: causal attention alone gives
        the real tokens their states, and padding is never scored."""
        if "labels" not in inputs:
            raise ValueError(f"batch has no 'labels' (keys: {sorted(inputs)})")
        if self.model is None:
            raise RuntimeError("the model is built by configure_model(); call it once")
        if self.token_id_fold is not None:
            inputs = fold_vlm_ids(inputs, self.token_id_fold, self.vision_ids)
        kwargs = {k: v for k, v in inputs.items() if k not in NOT_MODEL_INPUTS}
        if "cu_seqlens" in inputs or meta is not None:
            # A packed row: transformers finds the samples from the text positions (row 0
            # of position_ids), and must not get a mask that would override them.
            kwargs.pop("attention_mask", None)
        pixels = kwargs.get(PIXEL_VALUES)
        has_images = pixels is not None and pixels.numel() > 0
        if not has_images:
            kwargs.pop(PIXEL_VALUES, None)
            kwargs.pop(IMAGE_GRID_THW, None)
        hidden = self.multimodal_body()(**kwargs, use_cache=False).last_hidden_state
        loss_sum, num_loss_tokens = chunked_lm_loss(
            hidden, inputs["labels"], self.model.get_output_embeddings(), self.loss_chunk_tokens
        )
        if not has_images:
            loss_sum = loss_sum + self.dummy_vision_loss()
        return loss_sum, num_loss_tokens
