"""The sweep's comparison files (``app/sweep.py``) from job directories as Hydra leaves
them: ``.hydra/overrides.yaml`` and ``summary.json`` or ``failed.json`` in each."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from odb_lightning.app.sweep import (
    CSV_NAME,
    PLOT_NAME,
    TABLE_NAME,
    SweepSummary,
    fitted_limits,
    read_points,
    write_sweep_summary,
)


def make_job(sweep: Path, job: int, overrides: list[str], summary=None, failure=None) -> None:
    job_dir = sweep / str(job)
    (job_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
    if summary is not None:
        (job_dir / "summary.json").write_text(json.dumps(summary))
    if failure is not None:
        (job_dir / "failed.json").write_text(json.dumps(failure))


def summary_of(budget: int, steps: int, rate: float, loss: float) -> dict:
    return {
        "mode": "odb",
        "token_budget": budget,
        "optimizer_steps": steps,
        "real_tokens_per_s": rate,
        "val_loss": loss,
        "padding_efficiency": 0.9,
        "per_rank": [{"steps": steps}],
    }


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for job, budget in enumerate([2048, 4096]):
        overrides = ["debug=smoke", f"batching.token_budget={budget}"]
        make_job(
            tmp_path, job, overrides, summary_of(budget, 20 // (job + 1), 1000.0 * (job + 1), 8.3)
        )
    failure = {"error": "ConfigError", "message": "data.sizes.max_seq_len (1024) must not exceed"}
    make_job(tmp_path, 2, ["debug=smoke", "batching.token_budget=512"], failure=failure)
    (tmp_path / "multirun.yaml").write_text("{}\n")  # not a job: no .hydra/
    return tmp_path


def test_table_compares_the_points_on_what_differs(sweep: Path) -> None:
    written = write_sweep_summary(sweep)
    assert [p.name for p in written] == [TABLE_NAME, CSV_NAME, PLOT_NAME]
    with (sweep / CSV_NAME).open() as rows:
        table = list(csv.DictReader(rows))
    assert [row["job"] for row in table] == ["0", "1", "2"]
    assert "debug" not in table[0]  # the same in every point
    assert [row["batching.token_budget"] for row in table] == ["2048", "4096", "512"]
    assert [row["status"] for row in table] == ["ok", "ok", "failed (ConfigError)"]
    for row, job in zip(table[:2], (0, 1), strict=True):
        summary = json.loads((sweep / str(job) / "summary.json").read_text())
        assert float(row["real_tokens_per_s"]) == summary["real_tokens_per_s"]
        assert int(row["optimizer_steps"]) == summary["optimizer_steps"]
    assert table[2]["real_tokens_per_s"] == ""
    assert "mfu" not in table[0]  # no point has it
    markdown = (sweep / TABLE_NAME).read_text().splitlines()
    assert markdown[0].startswith("| job | batching.token_budget | status | mode |")
    assert len([line for line in markdown if line.startswith("| ")]) == 1 + 3
    assert "- job 2: data.sizes.max_seq_len (1024) must not exceed" in markdown
    assert (sweep / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_points_in_job_order(tmp_path: Path) -> None:
    for job in (10, 2, 1):
        make_job(tmp_path, job, [f"seed={job}"], summary_of(2048, job, 1.0, 1.0))
    assert [p.job for p in read_points(tmp_path)] == ["1", "2", "10"]


def test_no_plot_before_a_point_finished(tmp_path: Path) -> None:
    make_job(tmp_path, 0, ["seed=1"], failure={"error": "ValueError", "message": "m"})
    assert [p.name for p in write_sweep_summary(tmp_path)] == [TABLE_NAME, CSV_NAME]


def test_callback_writes_only_in_a_multirun(sweep: Path) -> None:
    def config(mode: str) -> SimpleNamespace:
        hydra = SimpleNamespace(mode=SimpleNamespace(name=mode), sweep=SimpleNamespace(dir=sweep))
        return SimpleNamespace(hydra=hydra)

    SweepSummary().on_job_end(config("RUN"), None)  # type: ignore[arg-type]
    assert not (sweep / TABLE_NAME).exists()
    SweepSummary().on_job_end(config("MULTIRUN"), None)  # type: ignore[arg-type]
    assert (sweep / TABLE_NAME).exists()


def test_loss_axis_is_fitted_so_close_losses_differ() -> None:
    low, high = fitted_limits([8.312, 8.316])
    # The 0.004 between the two is five sevenths of the axis, not 0.05 % of a zero-based one.
    assert (8.316 - 8.312) / (high - low) == pytest.approx(5 / 7)
    assert low < 8.312 and high > 8.316
    low, high = fitted_limits([2.0, 2.0])
    assert low < 2.0 < high


def test_plot_has_the_padding_efficiency_panel(tmp_path: Path) -> None:
    import matplotlib.image

    make_job(tmp_path, 0, ["seed=1"], summary_of(2048, 3, 10.0, 8.312))
    make_job(tmp_path, 1, ["seed=2"], summary_of(2048, 3, 11.0, 8.316))
    paths = write_sweep_summary(tmp_path)
    assert paths[-1].name == PLOT_NAME
    height, width, _ = matplotlib.image.imread(paths[-1]).shape
    # Three panels (tokens/s, padding efficiency, loss), each at least 6 inches wide.
    assert width >= 3 * 6 * 110 * 0.95


def test_a_point_is_read_from_its_newest_attempt(tmp_path: Path) -> None:
    """With ckpt_path=auto a point's Hydra files are .hydra_attempt-<time>/ (one per
    attempt of a requeued point); the other ranks' .hydra_rank<r>/ are not a point."""
    job = tmp_path / "0"
    for name, seed in [(".hydra_attempt-2026-12-06_10-00-00", 1), (".hydra_rank1", 9)]:
        (job / name).mkdir(parents=True)
        OmegaConf.save(
            OmegaConf.create([f"seed={seed}", "ckpt_path=auto"]), job / name / "overrides.yaml"
        )
    (job / ".hydra_attempt-2026-12-06_11-00-00").mkdir()
    OmegaConf.save(
        OmegaConf.create(["seed=2", "ckpt_path=auto"]),
        job / ".hydra_attempt-2026-12-06_11-00-00" / "overrides.yaml",
    )
    (job / "summary.json").write_text(json.dumps(summary_of(2048, 3, 1.0, 1.0)))
    (tmp_path / "1" / ".hydra_rank1").mkdir(parents=True)  # no rank 0 files: no point
    (point,) = read_points(tmp_path)
    assert (point.job, point.overrides["seed"], point.status) == ("0", "2", "ok")
    assert [p.name for p in write_sweep_summary(tmp_path)][:2] == [TABLE_NAME, CSV_NAME]


def _multirun_config(sweep_dir: str, hydra_overrides: list[str]) -> DictConfig:
    config = OmegaConf.create({
        "hydra": {
            "mode": "MULTIRUN",
            "run": {"dir": "outputs/${name}"},
            "sweep": {"dir": sweep_dir},
            "overrides": {"hydra": hydra_overrides, "task": []},
        },
        "name": "a run",
    })  # fmt: skip
    OmegaConf.set_readonly(config.hydra, True)
    return config


def test_the_sweep_dir_is_resolved_once_for_every_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's process resolves hydra.sweep.dir and hands it to every point as a
    Hydra override that the override parser reads back as the same path."""
    monkeypatch.chdir(tmp_path)
    config = _multirun_config("${hydra.run.dir}/multirun", ["hydra.sweep.dir=old", "x=1"])
    SweepSummary().on_multirun_start(config)
    expected = tmp_path / "outputs" / "a run" / "multirun"
    assert config.hydra.sweep.dir == str(expected)
    given, fixed = list(config.hydra.overrides.hydra)
    assert given == "x=1"
    parsed = OverridesParser.create().parse_overrides([fixed])[0]
    assert (parsed.key_or_group, parsed.value()) == ("hydra.sweep.dir", str(expected))


def test_a_sweep_with_no_point_says_so_and_exits_1(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _multirun_config(str(tmp_path / "multirun"), [])
    with pytest.raises(SystemExit) as exited:
        SweepSummary().on_multirun_end(config)
    assert exited.value.code == 1
    assert f"the sweep has no point in {tmp_path / 'multirun'} (no job directory" in caplog.text
