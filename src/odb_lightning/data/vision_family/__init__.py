"""Image-text model families: what the rest of the code may ask of one, and the families.

:class:`VisionFamily` is that contract: the ids that frame an image (read from the
tokenizer), the image processor, the rotary position rule, the patch layout of the
model's vision tower, the model config of a random init, the multimodal body and the
zero-weight dummy pass that keeps the vision tower in every step. :data:`VISION_FAMILIES`
registers each family by name, one line each, and :func:`vision_family_of` picks the one
that fits a tokenizer. The data layer
(:class:`~odb_lightning.data.vision_dataset.VisionChatDataset`) and the module
(:class:`~odb_lightning.lit.model.vlm_module.VisionLanguageModule`) ask the family; the
runtime's collates (:mod:`odb_lightning.runtime.vlm_batch`) only concatenate what it put in
the samples. This package is the only place that names a family
(``tests/unit/data/test_vision_family.py``); a second family is a second subclass of
:class:`VisionFamily` and one more registry line.

:class:`Qwen2VLFamily`, the one family today, owns everything that is Qwen2-VL's rather
than any image-text model's: ``<|vision_start|>``, ``<|vision_end|>`` and ``<|image_pad|>``,
``transformers``' own image processor (PIL backend) and its smart resize, M-RoPE (the
model's ``get_rope_index``) and ``Qwen2VLConfig``.
"""

from __future__ import annotations

from odb_lightning.data.vision_family.contract import (
    DUMMY_GRID,
    ImageProcessing,
    PatchLayout,
    VisionFamily,
)
from odb_lightning.data.vision_family.qwen2_vl import (
    ImageProcessor,
    Qwen2VLFamily,
    default_mrope_section,
    mrope_positions,
)

VISION_FAMILIES: dict[str, type[VisionFamily]] = {
    family.name: family
    for family in [
        Qwen2VLFamily,
    ]
}
"""Every image-text family by name; a new family is its class plus one line here."""


def vision_family_of(tokenizer: object) -> VisionFamily:
    """The first registered family whose framing tokens ``tokenizer`` has, with its ids.

    Raises:
        ValueError: No family fits; the message names each family and what it lacks.
    """
    misfits = []
    for name, family in VISION_FAMILIES.items():
        try:
            return family.of_tokenizer(tokenizer)
        except ValueError as error:
            misfits.append(f"{name}: {error}")
    raise ValueError(
        f"no vision family fits the tokenizer {type(tokenizer).__name__}; the families "
        f"known are {', '.join(VISION_FAMILIES)} ({'; '.join(misfits)})"
    )


__all__ = [
    "DUMMY_GRID",
    "VISION_FAMILIES",
    "ImageProcessing",
    "ImageProcessor",
    "PatchLayout",
    "Qwen2VLFamily",
    "VisionFamily",
    "default_mrope_section",
    "mrope_positions",
    "vision_family_of",
]
