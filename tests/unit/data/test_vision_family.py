"""The vision-family registry: the family a tokenizer resolves to, the error that names
the families, and the rule that no code outside the adaptor names a family."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.data.vision import VisionTokens
from odb_lightning.data.vision_family import (
    VISION_FAMILIES,
    Qwen2VLFamily,
    VisionFamily,
    vision_family_of,
)

SRC = Path(__file__).resolve().parents[3] / "src" / "odb_lightning"
ADAPTOR = "data/vision_family/"
"""The one package that names a family (its contract, registry and families)."""
FAMILY_NAME = re.compile(r"qwen2[-_ ]?vl", re.IGNORECASE)
"""``Qwen2VL``, ``qwen2_vl``, ``Qwen2-VL`` in any case."""


def files_naming_a_family() -> set[str]:
    """The package's modules (relative to it) whose text names a family."""
    return {
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if FAMILY_NAME.search(path.read_text(encoding="utf-8"))
    }


def test_no_module_but_the_adaptor_names_a_family() -> None:
    naming = files_naming_a_family()
    assert f"{ADAPTOR}qwen2_vl.py" in naming  # the check sees the family where it is
    outside = {name for name in naming if not name.startswith(ADAPTOR)}
    assert not outside, (
        f"{sorted(outside)} name an image-text family: ask the family through "
        f"odb_lightning.data.vision_family (VisionFamily, vision_family_of) instead"
    )


def test_the_registry_has_each_family_under_its_own_name() -> None:
    assert {"qwen2_vl": Qwen2VLFamily} == VISION_FAMILIES
    for name, family in VISION_FAMILIES.items():
        assert family.name == name
        assert issubclass(family, VisionFamily)


def test_a_tokenizer_resolves_to_the_family_with_its_ids(tokenizer) -> None:
    family = vision_family_of(tokenizer)
    assert family == Qwen2VLFamily.of_tokenizer(tokenizer)
    # The Qwen2.5 tokenizer's added tokens, as its tokenizer_config lists them.
    assert family.tokens == VisionTokens(
        vision_start_id=151652, vision_end_id=151653, image_pad_id=151655
    )


def test_a_tokenizer_no_family_fits_is_refused_naming_the_families() -> None:
    class NoVision(QwenTokenizer):
        def special_token_id(self, token: str) -> int:
            if token == "<|image_pad|>":
                raise ValueError(f"this tokenizer has no special token {token}")
            return super().special_token_id(token)

    with pytest.raises(ValueError, match=r"no vision family fits .* known are qwen2_vl") as info:
        vision_family_of(NoVision())
    assert "no special token <|image_pad|>" in str(info.value)  # what the family lacks
    with pytest.raises(ValueError, match=r"object names no special tokens"):
        vision_family_of(object())
