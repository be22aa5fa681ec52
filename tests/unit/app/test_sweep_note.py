"""A smoke sweep of batching modes says why its tokens/s cannot show the speed-up and
which study does; other sweeps say nothing of it."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from odb_lightning.app.sweep import SMOKE_NOTE, TABLE_NAME, write_sweep_summary


def make_point(sweep: Path, job: int, overrides: list[str]) -> None:
    job_dir = sweep / str(job)
    (job_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
    summary = {"real_tokens_per_s": 1500.0 + job, "padding_efficiency": 0.5 + job / 4}
    (job_dir / "summary.json").write_text(json.dumps(summary))


def test_a_smoke_sweep_of_modes_names_the_study_that_shows_the_speed_up(tmp_path: Path) -> None:
    for job, mode in enumerate(["odb", "standard"]):
        make_point(tmp_path, job, ["debug=smoke", f"batching={mode}"])
    write_sweep_summary(tmp_path)
    table = (tmp_path / TABLE_NAME).read_text()
    assert table.rstrip().endswith(SMOKE_NOTE)
    assert "python -m experiments.throughput.run" in SMOKE_NOTE


def test_other_sweeps_carry_no_note(tmp_path: Path) -> None:
    for job, budget in enumerate([2048, 4096]):
        make_point(tmp_path / "budgets", job, ["debug=smoke", f"batching.token_budget={budget}"])
        make_point(tmp_path / "modes", job, [f"batching={('odb', 'standard')[job]}"])
    for sweep in ("budgets", "modes"):
        write_sweep_summary(tmp_path / sweep)
        assert SMOKE_NOTE not in (tmp_path / sweep / TABLE_NAME).read_text()
