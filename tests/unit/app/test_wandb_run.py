"""The W&B run id belongs to the run directory: the first job draws and stores it, a
resume passes it back with ``resume="allow"``, a user's own id is kept."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from odb_lightning.app.wandb_run import WANDB_ID_FILE, wandb_run_ids

LOGGERS = {
    "wandb": {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "p"},
    "csv": {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": "x"},
}


def test_a_resume_logs_into_the_run_the_first_job_started(tmp_path: Path) -> None:
    first = wandb_run_ids(OmegaConf.create(LOGGERS), tmp_path, resuming=False)
    identifier = first["wandb"]["id"]
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == identifier
    assert first == {"wandb": {"id": identifier, "resume": "allow"}}  # not the CSV logger
    resumed = wandb_run_ids(OmegaConf.create(LOGGERS), tmp_path, resuming=True)
    assert resumed["wandb"]["id"] == identifier
    # A new job in the same directory (no resume) is a new run.
    again = wandb_run_ids(OmegaConf.create(LOGGERS), tmp_path, resuming=False)
    assert again["wandb"]["id"] != identifier


def test_a_resume_without_a_stored_id_and_a_users_own_id(tmp_path: Path) -> None:
    resumed = wandb_run_ids(OmegaConf.create(LOGGERS), tmp_path, resuming=True)
    assert resumed["wandb"]["id"] == (tmp_path / WANDB_ID_FILE).read_text().strip()
    own = OmegaConf.create(LOGGERS)
    own.wandb.id = "mine"  # the user's own id is passed by the config itself
    assert wandb_run_ids(own, tmp_path / "other", resuming=True) == {}
    assert not (tmp_path / "other").exists()
    assert wandb_run_ids(None, tmp_path, resuming=True) == {}
