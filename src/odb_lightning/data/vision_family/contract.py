"""What the rest of the code may ask of an image-text model family (:class:`VisionFamily`)
and the shapes it speaks in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple, Self

from torch import Tensor, nn

from odb_lightning.data.vision import ImageSettings, VisionTokens, VisionTower

DUMMY_GRID = (1, 2, 2)
"""The dummy image's patch grid: one merge window, the smallest image the tower takes."""


class PatchLayout(NamedTuple):
    """How a model's vision tower takes its patches."""

    patch_dim: int
    """Values per row of ``pixel_values`` (channels x frames x patch area)."""
    merge_size: int
    """Patches merged per side into one LLM token."""


ImageProcessing = Callable[[Sequence[Any]], tuple[Tensor, Tensor]]
"""Decoded images to ``pixel_values`` float32 ``[patches, patch_dim]`` and
``image_grid_thw`` long ``[images, 3]`` (both empty for no image)."""


class VisionFamily(ABC):
    """What the rest of the code may ask an image-text model family (the module docstring).

    A family is a frozen dataclass (its instances travel to the loader workers and into
    the module's hyperparameters as ``_target_`` nodes) whose ``tokens`` field holds the
    tokenizer's ids that frame an image. The samples it makes carry ``pixel_values``,
    ``image_grid_thw``, ``position_ids`` and ``num_image_tokens``
    (:mod:`odb_lightning.sample`); the collates lay out whatever position rows they carry.
    """

    name: ClassVar[str]
    """Its :data:`VISION_FAMILIES` name; the length cache's key holds it (the family's
    image processor decides each image's token count)."""
    tokens: VisionTokens
    """The ids that open an image, close it and stand for one merged cell."""

    @classmethod
    @abstractmethod
    def of_tokenizer(cls, tokenizer: object) -> Self:
        """The family with ``tokenizer``'s own ids of its framing tokens.

        Raises:
            ValueError: The tokenizer lacks one of them (the message says which).
        """

    @abstractmethod
    def image_processor(self, settings: ImageSettings) -> ImageProcessing:
        """The image processor of ``settings`` (``data.images``), picklable for the workers."""

    @abstractmethod
    def positions(self, input_ids: Tensor, grid_thw: Tensor, merge_size: int) -> Tensor:
        """One sample's rotary positions, long ``[rows, L]`` (row 0 the text positions)."""

    @abstractmethod
    def patch_layout(self, model: nn.Module) -> PatchLayout:
        """How ``model``'s vision tower takes its patches."""

    @abstractmethod
    def model_config(self, text: Any, tower: VisionTower, fold: int | None) -> Any:
        """The ``transformers`` config of a random init: the language model of ``text`` (a
        causal-LM config), the vision tower ``tower``, and the vision ids (the last three
        of a ``fold``-token vocabulary when ids are folded)."""

    @abstractmethod
    def multimodal_body(self, model: nn.Module) -> nn.Module:
        """The model's vision tower + language model (hidden states, no LM head), under
        LoRA too."""

    @abstractmethod
    def dummy_vision_loss(self, model: nn.Module) -> Tensor:
        """A loss term that is 0 and reaches every vision parameter (a batch without an
        image still runs the tower)."""
