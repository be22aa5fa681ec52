"""Data sizes as counts, fractions of the source, or null; and a file smaller than the
default experiment's sizes trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.configs import ComposeConfig
from odb_lightning.app.validation import ConfigError, validate_config
from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import QwenTokenizer
from odb_lightning.data.sizes import check_size, kept_records, validation_count
from odb_lightning.lit.data.datamodule import ODBDataModule


@pytest.mark.parametrize(
    ("val_samples", "num_records", "expected"),
    [
        (0.05, 20, 1),  # 1.0
        (0.05, 10, 1),  # 0.5 rounds to 0, at least one
        (0.2, 80, 16),  # debug=smoke
        (0.99, 5, 4),  # leaves one for training
        (0.5, 1, 0),  # a single record: no validation
        (None, 10, 0),
        (0, 10, 0),
        (3, 10, 3),
    ],
)
def test_validation_count(val_samples, num_records: int, expected: int) -> None:
    assert validation_count(val_samples, num_records) == expected


def test_kept_records() -> None:
    assert kept_records(None, 37) == 37
    assert kept_records(100, 37) == 37 and kept_records(10, 37) == 10
    assert kept_records(0.5, 37) == 18  # rounds down
    assert kept_records(0.01, 37) == 1  # at least one


@pytest.mark.parametrize("value", [-1, 0.0, 1.0, 1.5, "all", True])
def test_bad_sizes_are_refused_naming_the_key(value, compose_cfg: ComposeConfig) -> None:
    with pytest.raises(ValueError, match=r"^val_samples must be null, an integer >= 0"):
        check_size("val_samples", value, least=0)
    cfg = compose_cfg([f"data.sizes.max_samples={json.dumps(value)}"])
    expected = r"^invalid config 'data.sizes.max_samples': data.sizes.max_samples must be null"
    with pytest.raises(ConfigError, match=expected):
        validate_config(cfg)


def test_a_file_of_ten_records_trains_on_nine(tmp_path: Path, compose_cfg: ComposeConfig) -> None:
    path = tmp_path / "ten.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path.write_text("".join(json.dumps({"id": k, "messages": turns}) + "\n" for k in range(10)))
    cfg = compose_cfg(["data=jsonl", f"data.source.path={path}"])
    assert cfg.data.sizes.max_samples is None and cfg.data.sizes.val_samples == 0.05
    data = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(), name="jsonl", path=str(path),
        max_samples=cfg.data.sizes.max_samples, val_samples=cfg.data.sizes.val_samples,
        record_dir=str(tmp_path / "records"),
    )  # fmt: skip
    data.setup("fit")
    assert data.num_train_samples == 9 and len(data.val_set) == 1
    half = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(), name="jsonl", path=str(path), max_samples=0.5,
        val_samples=0.2, record_dir=str(tmp_path / "records"),
    )  # fmt: skip
    half.setup("fit")
    assert len(half.dataset) == 5 and half.source_counts["kept"] == 5
    assert half.num_train_samples == 4
