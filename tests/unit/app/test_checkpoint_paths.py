"""What a ``ckpt_path`` gets: a file that is no checkpoint is named the same way by
``eval.py``, ``train.py`` and ``odb-export``; ``ckpt_path=auto`` takes the newest valid
checkpoint of the run directory or starts anew, saying which; a sharded directory under
a strategy that cannot read it names the one that can."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from odb_lightning.app.checkpoints import (
    CheckpointStrategyError,
    NotACheckpointError,
    check_strategy_reads,
    resolve_resume_checkpoint,
)
from odb_lightning.app.export import main as export_main
from odb_lightning.app.run_dir import auto_resume_dir, resume_dir, resume_tag

NOT_A_CHECKPOINT = "is not a torch checkpoint (torch.save writes a zip archive)"


def _not_a_checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "notes.ckpt"
    path.write_text("these are my notes, not weights")
    return path


def test_eval_and_export_name_a_file_that_is_no_checkpoint_alike(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """eval.py used to raise torch's bare "mmap can only be used with files saved with
    torch.save(_use_new_zipfile_serialization=True)"."""
    from odb_lightning.app.evaluate import main as eval_main

    path = _not_a_checkpoint(tmp_path)
    cfg = OmegaConf.create({"ckpt_path": str(path), "paths": {"output_dir": str(tmp_path)}})
    with pytest.raises(SystemExit) as exit_info:
        eval_main(cfg)
    assert exit_info.value.code == 1
    assert (
        f"evaluation failed: NotACheckpointError: {path} {NOT_A_CHECKPOINT}: pass as ckpt_path "
        "a checkpoint that train.py wrote (<run dir>/checkpoints/last.ckpt, a .ckpt file, or "
        "under FSDP2 a .ckpt directory of shards)"
    ) in caplog.text
    assert "Traceback" not in caplog.text and "mmap" not in caplog.text
    assert export_main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"odb-export: error: {path} {NOT_A_CHECKPOINT}" in capsys.readouterr().err


def test_a_missing_or_truncated_ckpt_path_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(NotACheckpointError, match=r"missing\.ckpt does not exist: pass as"):
        resolve_resume_checkpoint(tmp_path / "missing.ckpt")
    torch.save({"global_step": 1}, tmp_path / "whole.ckpt")
    (tmp_path / "cut.ckpt").write_bytes((tmp_path / "whole.ckpt").read_bytes()[:200])
    with pytest.raises(
        NotACheckpointError, match=r"cut\.ckpt is cut short \(a zip archive without its end"
    ):
        resolve_resume_checkpoint(tmp_path / "cut.ckpt")


def _aged(path: Path, seconds_ago: float) -> None:
    stamp = path.stat().st_mtime - seconds_ago
    os.utime(path, (stamp, stamp))


def test_auto_starts_anew_where_there_is_no_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    checkpoints = tmp_path / "checkpoints"
    assert resolve_resume_checkpoint("auto", checkpoints) is None
    assert f"ckpt_path=auto: no valid checkpoint in {checkpoints}: starting a new run" in (
        caplog.text
    )


def test_auto_skips_a_truncated_newest_checkpoint_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    torch.save({"global_step": 3}, tmp_path / "epoch0-step3.ckpt")
    _aged(tmp_path / "epoch0-step3.ckpt", 60)
    (tmp_path / "epoch0-step6.ckpt").write_bytes(b"PK\x03\x04 cut short by a kill")
    chosen = resolve_resume_checkpoint("auto", tmp_path)
    assert chosen == str(tmp_path / "epoch0-step3.ckpt")
    assert "ckpt_path=auto: skipping epoch0-step6.ckpt (it is cut short (a zip archive" in (
        caplog.text
    )
    assert f"ckpt_path=auto: resuming from {chosen}" in caplog.text


def test_auto_takes_last_ckpt_when_it_loads(tmp_path: Path) -> None:
    torch.save({"global_step": 3}, tmp_path / "stop-epoch0-step3.ckpt")
    os.symlink("stop-epoch0-step3.ckpt", tmp_path / "last.ckpt")
    assert resolve_resume_checkpoint("auto", tmp_path) == str(tmp_path / "last.ckpt")


def test_auto_keeps_the_run_directory_and_a_requeued_slurm_job_finds_its_own() -> None:
    new = "outputs/train/2026-12-02_10-00-00"
    assert resume_dir("auto", new) == new  # hydra.run.dir=<run> names it
    assert auto_resume_dir(new, {}) == new
    assert auto_resume_dir(new, {"SLURM_JOB_ID": "4242"}) == "outputs/train/slurm-4242"
    array = {"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4200", "SLURM_ARRAY_TASK_ID": "3"}
    assert auto_resume_dir(new, array) == "outputs/train/slurm-4200_3"
    srun = "outputs/train/slurm-4242.0"  # several tasks: already the job's own name
    assert auto_resume_dir(srun, {"SLURM_JOB_ID": "4242"}) == srun
    assert resume_tag("auto").startswith("_attempt-")  # may start anew: no "resumed"


def test_a_sharded_directory_under_a_single_file_strategy_names_the_fix(tmp_path: Path) -> None:
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from odb_lightning.lit.model.fsdp2 import FSDP2Strategy

    directory = tmp_path / "epoch0-step3.ckpt"
    directory.mkdir()
    with pytest.raises(CheckpointStrategyError) as refused:
        check_strategy_reads(str(directory), SingleDeviceStrategy("cpu"))
    assert str(refused.value) == (
        f"ckpt_path={directory} is a sharded (FSDP2) checkpoint directory, which this "
        "trainer's strategy (SingleDeviceStrategy) cannot read: resume it with the FSDP2 "
        "strategy that wrote it, trainer=fsdp_cpu (CPU) or trainer=gpu8_fsdp (GPUs); "
        "eval.py and odb-export read it in one process"
    )
    check_strategy_reads(str(directory), FSDP2Strategy())
    torch.save({}, tmp_path / "one.ckpt")
    check_strategy_reads(str(tmp_path / "one.ckpt"), SingleDeviceStrategy("cpu"))
