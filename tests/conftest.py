"""Fixtures shared by every tier: process-group teardown, the Qwen tokenizer and the
composed ``train`` config.

Shared helpers that are not fixtures live in ``tests/helpers/``; what experiments share
with the tests lives in :mod:`experiments.harness`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from helpers.configs import ComposeConfig
    from odb_lightning.data import QwenTokenizer


@pytest.fixture(autouse=True)
def _no_leftover_process_group() -> Iterator[None]:
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


@pytest.fixture
def compose_cfg(tmp_path: Path) -> ComposeConfig:
    """``compose_cfg(overrides)``: ``conf/train.yaml`` composed as ``train.py`` composes it,
    its output and root directories in this test's ``tmp_path``."""
    from helpers.configs import compose_train  # imported here: most tests compose nothing

    return functools.partial(compose_train, tmp_path)
