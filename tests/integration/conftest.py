"""Fixtures of the integration tests that several modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.torchrun import run_script_on_ranks


@pytest.fixture(scope="session")
def exact_loss_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of :mod:`exact_loss_job`'s records: one 2-rank torchrun job for the
    exact-loss tests of DDP, FSDP2, LoRA, loss scaling and the image-text model."""
    out_dir = tmp_path_factory.mktemp("exact_loss")
    run_script_on_ranks(str(Path(__file__).with_name("exact_loss_job.py")), str(out_dir))
    return out_dir
