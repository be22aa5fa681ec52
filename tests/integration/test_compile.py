"""``model.runtime.compile=true`` over a real ODB epoch: every decoder layer compiled in place with
dynamic shapes, the summary's recompiles bounded, the loss the eager run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.train_run import train

pytestmark = pytest.mark.slow  # inductor compiles C++ kernels: a minute or more on two cores


@pytest.mark.parametrize("batching", ["odb", "odb_packed"])
def test_compiled_smoke_epoch_recompiles_at_most_three_times(batching: str, tmp_path: Path) -> None:
    overrides = [f"batching={batching}", "model.architecture.num_hidden_layers=2"]
    eager = train(tmp_path / "eager", *overrides, timeout_s=600)
    compiled = train(tmp_path / "compiled", *overrides, "model.runtime.compile=true", timeout_s=900)
    assert "compile_graphs" not in eager
    assert compiled["steps_per_rank"] == eager["steps_per_rank"] >= 5  # shapes change per step
    assert compiled["compile_graphs"] >= 1 and compiled["compile_s"] > 0
    assert compiled["compile_recompiles"] <= 3
    # The compiled layers compute what the eager ones do (float32, fused kernels).
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-3)
