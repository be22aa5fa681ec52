"""The pytest fixtures that both test trees use, defined once: ``tests/conftest.py`` and
``experiments/tests/conftest.py`` import them, which registers them for their tree."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from odb_lightning.data import QwenTokenizer


@pytest.fixture(autouse=True)
def no_leftover_process_group() -> Iterator[None]:
    """Destroy a default process group a test left behind, so that the next test starts
    without one. No group can exist before something imports ``torch.distributed``, so
    the check itself imports nothing."""
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tokenizer() -> QwenTokenizer:
    """The Qwen2.5 tokenizer, loaded once here: forked loader workers inherit it loaded."""
    from odb_lightning.data import QwenTokenizer  # imported here: most tests need no tokenizer

    tokenizer = QwenTokenizer()
    tokenizer.encode_text("warm")
    return tokenizer
