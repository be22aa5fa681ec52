"""A quiet console: the library messages a user cannot act on are filtered where they are
emitted, each named here with the text its library writes; anything else still shows."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest
import transformers
from lightning.fabric.utilities.rank_zero import rank_zero_info

from odb_lightning.app.run_log import UNACTIONABLE_WARNINGS, quiet_console

ROOT = Path(__file__).resolve().parents[3]

EMITTED = [
    (
        UserWarning,
        "The `srun` command is available on your system but is not used. HINT: If your "
        "intention is to run Lightning on SLURM, prepend your python command with `srun` "
        "like so: srun python train.py debug=smoke ...",
    ),
    (
        FutureWarning,
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) "
        "and treespec.is_leaf()` instead.",
    ),
    (
        FutureWarning,
        "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
        "`is_activation_checkpointing` instead.",
    ),
    (UserWarning, "DTensor random operators may not have complete support on cpu device mesh"),
    (
        UserWarning,
        "Total length of `list` across ranks is zero. Please make sure this was your intention.",
    ),
    (
        UserWarning,
        "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to "
        "be provided during `Trainer` instantiation. Please add the following callbacks: "
        "['StepCounters']",
    ),
]
"""Each message as its library (at the versions installed) writes it."""


@pytest.mark.parametrize(("category", "text"), EMITTED, ids=lambda x: str(x)[:40])
def test_each_unactionable_warning_is_filtered(category: type[Warning], text: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_console()
        warnings.warn(text, category, stacklevel=1)
        warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a warning of the user's own"]


def test_every_filter_is_named_by_a_message_here() -> None:
    for _, pattern, why in UNACTIONABLE_WARNINGS:
        assert why and any(re.match(pattern, text) for _, text in EMITTED), pattern


def test_transformers_own_deprecation_is_filtered_at_its_source() -> None:
    config = transformers.Qwen2Config(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_console()
        assert model.is_gradient_checkpointing is False
    assert caught == []


def test_lightnings_tips_are_dropped_and_its_other_messages_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_console()
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try ...")
        rank_zero_info("GPU available: False, used: False")
    assert caplog.messages == ["GPU available: False, used: False"]


def test_make_installs_litdata_last_so_pip_reports_no_missing_torchvision() -> None:
    """On CPU, litdata goes in without torchvision: its other requirements first, then
    litdata alone with --no-deps, so no later install makes pip's check name torchvision."""
    recipe = (ROOT / "Makefile").read_text()
    deps = recipe.index("pip install -q $(LITDATA_DEPS)")
    assert deps < recipe.index('pip install -q --no-deps "$(LITDATA)"')
