"""What a user sees of a ``python train.py`` run: its directory named at the start and
under the summary, Lightning's messages and any error in ``train.log``, a config error as
its message without a traceback, a failed run marked ``failed.json``, a resume that
continues in its run's directory with the config saved in the checkpoint, and a sweep's
comparison table at the multirun root.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.configs import ComposeConfig
from helpers.train_run import ROOT
from odb_lightning.app.train import main
from odb_lightning.app.validation import ConfigError

BUDGET_ERROR = "data.sizes.max_seq_len (1024) must not exceed batching.token_budget (512)"


def run_train(cwd: Path, *overrides: str, env: dict[str, str] | None = None, timeout_s=600):
    command = [sys.executable, str(ROOT / "train.py"), *overrides]
    return subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_config_error_is_its_message_on_the_console_and_its_trace_in_the_log(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    overrides = ("debug=smoke", f"hydra.run.dir={run_dir}", "batching.token_budget=512")
    done = run_train(tmp_path, *overrides, env={"HYDRA_FULL_ERROR": "0"})
    assert done.returncode == 1
    assert BUDGET_ERROR in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    log = (run_dir / "train.log").read_text()
    # The config is checked before the run starts: the failure line names the directory.
    assert f"run directory marked failed: {run_dir / 'failed.json'}" in log
    assert BUDGET_ERROR in log and "Traceback (most recent call last)" in log
    assert "in validate_config" in log  # the whole trace, down to the check that failed
    marker = json.loads((run_dir / "failed.json").read_text())
    assert marker["error"] == "ConfigError" and BUDGET_ERROR in marker["message"]
    assert not (run_dir / "summary.json").exists()


@pytest.mark.parametrize("full_error", ["0", "1"])
def test_config_error_exits_1_or_raises_with_hydra_full_error(
    full_error: str, tmp_path: Path, compose_cfg: ComposeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: ``HYDRA_FULL_ERROR=1`` gets the error itself (Hydra prints its trace)."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", full_error)
    cfg = compose_cfg(["debug=smoke", "batching.token_budget=512"])
    expected = ConfigError if full_error == "1" else SystemExit
    with pytest.raises(expected) as raised:
        main(cfg)
    if expected is SystemExit:
        assert raised.value.code == 1
    assert json.loads((tmp_path / "failed.json").read_text())["error"] == "ConfigError"


@pytest.mark.slow  # one smoke training run: about 10-20 s on 2 cores
def test_run_names_its_directory_and_logs_lightning_into_train_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_train(tmp_path, "debug=smoke", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stderr
    assert console.count(f"run directory: {run_dir}") == 2
    assert "odb_lightning run summary" in done.stdout
    # The second one comes at the end, after the fit.
    assert console.rindex(f"run directory: {run_dir} (summary.json") > console.index(
        "`Trainer.fit` stopped"
    )
    log = (run_dir / "train.log").read_text()
    assert "`Trainer.fit` stopped: `max_epochs=1` reached." in log  # Lightning's own logger
    assert f"run directory: {run_dir}" in log
    assert "odb_lightning run summary" in log and "padding efficiency" in log  # the table
    assert not (run_dir / "failed.json").exists()
    # Every key of summary.json has a row in its documented table.
    documented = (ROOT / "docs" / "summary.md").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [key for key in summary if f"`{key}`" not in documented] == []


@pytest.mark.slow  # three smoke runs: about 30-60 s on 2 cores
def test_resume_continues_in_its_directory_with_the_saved_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run_train(
        tmp_path, "debug=smoke", "model.architecture.hidden_size=48", f"hydra.run.dir={run_dir}"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    before = json.loads((run_dir / "summary.json").read_text())
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    # Only ckpt_path and a longer schedule: debug=smoke and model.architecture.hidden_size
    # come from the checkpoint (without them this config is the 896-wide default model,
    # which does not load the 48-wide weights), and no hydra.run.dir: the run's own directory.
    resumed = run_train(tmp_path, f"ckpt_path={ckpt}", "trainer.max_epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "outputs").exists()
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["model"] == before["model"]
    assert after["train_samples"] == before["train_samples"] == 64
    assert after["emitted_samples"] == 2 * 64  # both epochs, the first from the checkpoint
    assert after["optimizer_steps"] > before["optimizer_steps"]
    assert ckpt.resolve().name == f"epoch1-step{after['optimizer_steps']}.ckpt"
    (resume_files,) = run_dir.glob(".hydra_resumed-*")
    assert (
        "model.architecture.hidden_size=48" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    )
    assert "trainer.max_epochs=2" in (resume_files / "overrides.yaml").read_text()
    assert not (run_dir / "wandb").exists()  # the CSV-only run got no W&B logger
    # A shape the checkpoint does not have: the error names the key.
    wider = run_train(tmp_path, f"ckpt_path={ckpt}", "model.architecture.hidden_size=64")
    assert wider.returncode == 1
    assert "model.architecture.hidden_size=64 here, 48 in the checkpoint" in wider.stderr
    assert "Traceback" not in wider.stderr


@pytest.mark.slow  # a 2-point sweep, one point failing at startup: about 15-30 s on 2 cores
def test_sweep_writes_its_comparison_at_the_multirun_root(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    done = run_train(
        tmp_path,
        "-m",
        "debug=smoke",
        "batching.token_budget=512,4096",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert done.returncode != 0  # a point failed, and the sweep says so
    with (sweep_dir / "summary_table.csv").open() as rows:
        table = list(csv.DictReader(rows))
    assert [row["batching.token_budget"] for row in table] == ["512", "4096"]
    assert table[0]["status"] == "failed (ConfigError)"
    summary = json.loads((sweep_dir / "1" / "summary.json").read_text())
    assert table[1]["status"] == "ok"
    assert float(table[1]["real_tokens_per_s"]) == summary["real_tokens_per_s"]
    assert int(table[1]["optimizer_steps"]) == summary["optimizer_steps"]
    assert BUDGET_ERROR in (sweep_dir / "summary_table.md").read_text()
    assert (sweep_dir / "summary_plot.png").stat().st_size > 0
