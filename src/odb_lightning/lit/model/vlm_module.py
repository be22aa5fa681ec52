"""Vision-language LightningModule: a vision family's model under the token-weighted loss.

The batch carries ``pixel_values`` and ``image_grid_thw`` beside the tokens and the 3-D
rotary ``position_ids`` (:mod:`odb_lightning.runtime.vlm_batch`); the model's own
multimodal body (vision tower, merger, language model) turns them into hidden states and
the chunked LM head scores the supervised positions, as in
:class:`~odb_lightning.lit.model.module.CausalLMModule`. Image tokens are never supervised.

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
from typing_extensions import override

from odb_lightning.core.nodes import plain
from odb_lightning.core.rows import StepShape
from odb_lightning.data.vision import VisionTower
from odb_lightning.data.vision_family import VisionFamily
from odb_lightning.lit.model.attention_inputs import warmup_batch
from odb_lightning.lit.model.lm_head import chunked_lm_loss
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import pad_collate
from odb_lightning.sample import IGNORE_INDEX, IMAGE_GRID_THW, MROPE_POSITIONS, PIXEL_VALUES

NOT_MODEL_INPUTS = ("labels", "cu_seqlens", "max_seqlen")


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
    """A model of the vision family ``family`` (random init from ``architecture`` and
    ``vision``, or the architecture's ``pretrained_path``).

    Args:
        family: The vision family (its model config, token ids and dummy pass), with the
            tokenizer's ids (:func:`~odb_lightning.data.vision_family.vision_family_of`).
        vision: The vision tower of a random init; ``None``: its defaults.
        **parts: :class:`~odb_lightning.lit.model.module.CausalLMModule` arguments (the text
            model and the training settings).
    """

    def __init__(
        self, *, family: VisionFamily, vision: VisionTower | None = None, **parts: Any
    ) -> None:
        # Before the base's constructor, which saves hyperparameters() (plain values: no
        # nn.Module state is needed to hold them).
        self.family, self.vision = family, vision or VisionTower()
        super().__init__(**parts)
        fold = self.token_id_fold
        if fold is not None and fold < 4:
            raise ValueError(
                f"model.architecture.token_id_fold must leave room for the 3 vision ids, got {fold}"
            )
        ids = family.tokens
        self.vision_ids = (ids.image_pad_id, ids.vision_start_id, ids.vision_end_id)
        # The text model's config (from CausalLMModule) inside the family's.
        self.random_init = family.model_config(self.random_init, self.vision, fold)

    @override
    def hyperparameters(self) -> dict[str, Any]:
        return super().hyperparameters() | {
            "family": plain(self.family),
            "vision": plain(self.vision),
        }

    def multimodal_body(self) -> Any:
        """The model's vision tower + language model, under LoRA too."""
        return self.family.multimodal_body(self.model)

    def dummy_vision_loss(self) -> Tensor:
        """The family's zero-weight pass through the vision tower: 0, reaching every vision
        parameter."""
        return self.family.dummy_vision_loss(self.model)

    def warmup_inputs(self, shape: StepShape, vocab_size: int) -> dict[str, Any]:
        """One memory warm-up batch of ``shape``: text rows as the text module makes them;
        with ``shape.image_grid``, every row one image of that grid (random pixels, its
        ``<|image_pad|>`` run framed by ``<|vision_start|>``/``<|vision_end|>``, its 3-D
        positions) then random text, every text target supervised."""
        if shape.image_grid is None:
            return warmup_batch(shape, vocab_size, self.device)
        t, h, w = shape.image_grid
        patch_dim, merge = self.family.patch_layout(self.model)
        cells = t * h * w // merge**2
        ids = self.family.tokens
        generator = torch.Generator().manual_seed(0)
        grid = torch.tensor([[t, h, w]])
        image = torch.tensor([ids.vision_start_id, *[ids.image_pad_id] * cells, ids.vision_end_id])
        samples = []
        for _ in range(shape.rows):
            text = torch.randint(0, vocab_size, (shape.tokens - cells - 2,), generator=generator)
            text[torch.isin(text, torch.tensor(self.vision_ids))] = 0  # text ids stay text
            input_ids = torch.cat([image, text])
            labels = input_ids.clone()
            labels[: cells + 2] = IGNORE_INDEX
            samples.append(
                {
                    "input_ids": input_ids,
                    "labels": labels,
                    PIXEL_VALUES: torch.randn((t * h * w, patch_dim), generator=generator),
                    IMAGE_GRID_THW: grid,
                    MROPE_POSITIONS: self.family.positions(input_ids, grid, merge),
                }
            )
        return {k: v.to(self.device) for k, v in pad_collate(samples).items()}

    @override
    def forward(self, inputs: Mapping[str, Tensor], meta: Any = None) -> tuple[Tensor, int]:
        """Summed token cross-entropy of an image-text batch and its supervised tokens.

        With the step's ``meta`` (a batch of this package's collates, right padded) the
        padded batch runs without its attention mask, as in
        :class:`~odb_lightning.lit.model.module.CausalLMModule`: causal attention alone gives
        the real tokens their states, and padding is never scored."""
        if "labels" not in inputs:
            raise ValueError(f"batch has no 'labels' (keys: {sorted(inputs)})")
        if self.model is None:
            raise RuntimeError("the model is built by configure_model(); call it once")
        if self.token_id_fold is not None:
            inputs = fold_vlm_ids(inputs, self.token_id_fold, self.vision_ids)
        kwargs = {k: v for k, v in inputs.items() if k not in NOT_MODEL_INPUTS}
        if "cu_seqlens" in inputs or meta is not None:
            # One row of several samples: transformers finds the samples from the text
            # positions (row 0 of position_ids), and must not get a mask that would override
            # them.
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
