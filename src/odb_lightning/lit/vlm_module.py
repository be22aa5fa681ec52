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
from typing import Any

import torch
from torch import Tensor
from transformers import Qwen2VLConfig
from typing_extensions import override

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


class VisionLanguageModule(CausalLMModule):
    """A Qwen2-VL model (random init from these arguments, or ``pretrained_path``).

    Takes every argument of :class:`~odb_lightning.lit.module.CausalLMModule` (the text
    model's shape and the training settings) plus the vision tower's shape.

    Args:
        vision_depth: Vision transformer blocks.
        vision_embed_dim: Their width.
        vision_num_heads: Their attention heads.
        vision_mlp_ratio: MLP width over ``vision_embed_dim``.
        patch_size: ViT patch side in pixels (must match the data's ``images``).
        spatial_merge_size: Patches merged per side into one LLM token.
        temporal_patch_size: Frames per patch.
        mrope_section: Rotary frequency pairs per axis; ``None``: Qwen2-VL's proportion.
        rope_theta: Rotary base of the language model.
        image_token_id: ``<|image_pad|>`` (and ``vision_start_token_id``,
            ``vision_end_token_id``): must match the data's ``vision_tokens``.
        **text: :class:`CausalLMModule` arguments.
    """

    def __init__(
        self,
        vision_depth: int = 2,
        vision_embed_dim: int = 32,
        vision_num_heads: int = 2,
        vision_mlp_ratio: int = 2,
        patch_size: int = 14,
        spatial_merge_size: int = 2,
        temporal_patch_size: int = 2,
        mrope_section: Sequence[int] | None = None,
        rope_theta: float = 1_000_000.0,
        image_token_id: int = 151655,
        vision_start_token_id: int = 151652,
        vision_end_token_id: int = 151653,
        **text: Any,
    ) -> None:
        super().__init__(**text)
        fold = self.token_id_fold
        if fold is not None and fold < 4:
            raise ValueError(f"token_id_fold must leave room for the 3 vision ids, got {fold}")
        vision_ids = (image_token_id, vision_start_token_id, vision_end_token_id)
        self.vision_ids = vision_ids
        model_ids = [fold - 1 - k for k in range(3)] if fold is not None else list(vision_ids)
        base = self.random_init  # the text model's Qwen2Config, from CausalLMModule
        head_dim = base.hidden_size // base.num_attention_heads
        section = list(mrope_section) if mrope_section else default_mrope_section(head_dim)
        if sum(section) != head_dim // 2:
            raise ValueError(f"mrope_section {section} must sum to head_dim / 2 = {head_dim // 2}")
        text_config = base.to_dict() | {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": rope_theta,
                "mrope_section": section,
            },
        }
        for key in ("architectures", "model_type", "transformers_version", "rope_scaling"):
            text_config.pop(key, None)
        self.random_init = Qwen2VLConfig(
            text_config=text_config,
            vision_config={
                "depth": vision_depth,
                "embed_dim": vision_embed_dim,
                "num_heads": vision_num_heads,
                "mlp_ratio": vision_mlp_ratio,
                "hidden_size": base.hidden_size,
                "patch_size": patch_size,
                "spatial_merge_size": spatial_merge_size,
                "temporal_patch_size": temporal_patch_size,
            },
            image_token_id=model_ids[0],
            vision_start_token_id=model_ids[1],
            vision_end_token_id=model_ids[2],
            tie_word_embeddings=base.tie_word_embeddings,
        )

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
