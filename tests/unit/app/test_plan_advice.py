"""``odb-plan`` says when the budget is large for the lengths, and the budget it names
plans the file with less padding."""

from __future__ import annotations

import random

from odb_lightning.app.plan import budget_advice, main
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.planners import plan_epoch
from odb_lightning.core.plans import summarize_plan


def small_file(n: int = 200, seed: int = 0) -> list[int]:
    draw = random.Random(seed)
    return [draw.randint(45, 552) for _ in range(n)]


def odb_padding(lengths: list[int], budget: int) -> float:
    config = BatchingConfig.of(mode="odb", token_budget=budget)
    return summarize_plan(lengths, plan_epoch(lengths, config), budget).padding_efficiency


def test_a_budget_large_for_the_file_is_said_with_one_that_fits() -> None:
    lengths = small_file()
    advice = budget_advice(lengths, 16384)
    assert advice is not None and advice.startswith("the budget is large for these lengths")
    assert "--budget 2048 plans about 32 steps" in advice
    assert odb_padding(lengths, 2048) > odb_padding(lengths, 16384)


def test_no_advice_where_the_file_fills_the_budget_many_times() -> None:
    assert budget_advice(small_file(), 2048) is None
    assert budget_advice(small_file(n=20_000), 16384) is None


def test_the_table_prints_the_note(capsys) -> None:
    assert main(["--synthetic", "300,0.4,200", "--budget", "16384", "--modes", "odb"]) == 0
    assert "note: the budget is large for these lengths" in " ".join(
        capsys.readouterr().out.split()
    )
