"""Loader options: typed, validated, and every error names its field."""

from __future__ import annotations

from enum import Enum

import pytest

from odb_lightning.core.settings import LoaderSettings
from odb_lightning.runtime import LoaderOptions, OnBadSample, StartMethod


class SchemaContext(Enum):
    """A config schema's own enum with the same values."""

    SPAWN = "spawn"


def test_defaults_and_enum_coercion() -> None:
    assert (
        LoaderOptions(
            token_budget=64, multiprocessing_context=SchemaContext.SPAWN
        ).multiprocessing_context
        is StartMethod.SPAWN
    )
    options = LoaderOptions(
        token_budget=4096, on_bad_sample="skip", multiprocessing_context="spawn"
    )
    assert options.on_bad_sample is OnBadSample.SKIP
    assert options.multiprocessing_context is StartMethod.SPAWN
    assert options.output_slots == 2 * options.max_steps_per_round == 16
    assert options.settings == LoaderSettings(token_budget=4096, outstanding_depth=256)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_budget", 0),
        ("outstanding_depth", -1),
        ("max_steps_per_round", 0),
        ("num_workers", -1),
        ("pad_id", -2),
        ("timeout_s", 0.0),
        ("alignment_timeout_s", float("inf")),
        ("join", 1),
        ("persistent_workers", "yes"),
        ("packed", None),
        ("on_bad_sample", "ignore"),
        ("multiprocessing_context", "threads"),
        ("max_seq_len", 0),
        ("attention_weight", -0.5),
        ("seed", 1.5),
    ],
)
def test_invalid_values_name_the_field(field: str, value: object) -> None:
    kwargs = {"token_budget": 1024, field: value}
    with pytest.raises(ValueError, match=field):
        LoaderOptions(**kwargs)  # type: ignore[arg-type]


def test_max_seq_len_above_budget_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"max_seq_len \(2048\) must not exceed token_budget"):
        LoaderOptions(token_budget=1024, max_seq_len=2048)
    assert LoaderOptions(token_budget=1024, max_seq_len=1024).max_seq_len == 1024
