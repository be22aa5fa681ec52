"""Fixtures shared by every tier: process-group teardown and the Qwen tokenizer (from
:mod:`testing.fixtures`, which the studies' tests share) and the composed ``train``
config.

Shared helpers that are not fixtures live in ``tests/helpers/``; what the studies share
with the tests lives in :mod:`testing.harness`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from testing.fixtures import no_leftover_process_group, tokenizer

if TYPE_CHECKING:
    from helpers.configs import ComposeConfig

__all__ = ["compose_cfg", "no_leftover_process_group", "tokenizer"]


@pytest.fixture
def compose_cfg(tmp_path: Path) -> ComposeConfig:
    """``compose_cfg(overrides)``: ``conf/train.yaml`` composed as ``train.py`` composes it,
    its output and root directories in this test's ``tmp_path``."""
    from helpers.configs import compose_train  # imported here: most tests compose nothing

    return functools.partial(compose_train, tmp_path)
