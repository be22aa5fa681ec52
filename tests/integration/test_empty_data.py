"""Data that leaves nothing to train on is refused before training, naming the file, what
was read and the fix; a fit that made no optimizer step writes no checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, IterableDataset

from helpers.configs import ComposeConfig
from helpers.train_run import ROOT
from odb_lightning.app.components import build_parts
from odb_lightning.lit.callbacks.checkpointing import (
    AtomicLinkModelCheckpoint,
    UntrainedCheckpointError,
)
from odb_lightning.lit.callbacks.run_report import RunReport
from odb_lightning.lit.data.train_records import NoTrainingRecordsError

EXAMPLE = '{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}'


def test_an_empty_jsonl_file_is_refused_before_training(tmp_path: Path) -> None:
    """The default (cosine) schedule used to fail with "a cosine schedule needs a length",
    and model.scheduler=constant trained 0 steps and wrote last.ckpt, exit 0."""
    data = tmp_path / "empty.jsonl"
    data.write_text("\n\n")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "train.py", "debug=smoke", f"hydra.run.dir={run_dir}", "data=jsonl",
         f"data.source.path={data}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert (
        f"data.source.name='jsonl' data.source.path='{data}': no records to train on: the file "
        f"has no non-blank line (0 records read). Each line is one conversation, {EXAMPLE}: point "
        "data.source.path at your conversations"
    ) in done.stderr
    assert "cosine" not in done.stderr and "Traceback" not in done.stderr
    assert not (run_dir / "summary.json").exists()
    assert not list(run_dir.glob("checkpoints/*.ckpt"))
    assert json.loads((run_dir / "failed.json").read_text())


def _setup(compose_cfg: ComposeConfig, data: Path, *overrides: str) -> RunReport:
    """The data module's report after ``setup``: what it read, kept and trains on."""
    cfg = compose_cfg(["debug=smoke", "data=jsonl", f"data.source.path={data}", *overrides])
    datamodule = build_parts(cfg, world_size=1, device="cpu").datamodule
    datamodule.setup("fit")
    return datamodule.run_report()


def test_every_line_rejected_is_refused_naming_the_count(
    compose_cfg: ComposeConfig, tmp_path: Path
) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"messages": []}\nnot json\n{"id": 3}\n')
    with pytest.raises(NoTrainingRecordsError) as refused:
        _setup(compose_cfg, data, "batching.loader.on_bad_sample=skip")
    assert str(refused.value) == (
        f"data.source.name='jsonl' data.source.path='{data}': no records to train on: read 3 "
        "lines and rejected all 3 as bad records (batching.loader.on_bad_sample=skip skipped "
        "them). "
        f"Each line is one conversation, {EXAMPLE}: fix the lines: with "
        "batching.loader.on_bad_sample=raise the first bad one is named with its line number "
        "and field"
    )


def test_one_good_line_among_rejected_ones_trains(
    compose_cfg: ComposeConfig, tmp_path: Path
) -> None:
    """The control: the refusal is for no record at all, not for some rejected."""
    data = tmp_path / "mixed.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(f"not json\n{json.dumps(good)}\n")
    facts = _setup(compose_cfg, data, "batching.loader.on_bad_sample=skip").facts
    assert facts["source_records"] == {"read": 2, "dropped/bad_record": 1, "kept": 1}
    assert (facts["train_samples"], facts["skipped_bad_records"]) == (1, 1)


class _Nothing(IterableDataset):
    """A loader of unknown length that yields no batch (as ODB's does for no sample)."""

    def __iter__(self):  # noqa: ANN204
        return iter(())


def _fit_on_nothing(callback: ModelCheckpoint, tmp_path: Path) -> None:
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, callbacks=[callback], logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(BoringModel(), train_dataloaders=DataLoader(_Nothing()), val_dataloaders=[])


def test_a_fit_without_an_optimizer_step_writes_no_checkpoint(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(UntrainedCheckpointError, match="ended after 0 optimizer steps"):
        _fit_on_nothing(AtomicLinkModelCheckpoint(dirpath=checkpoints, save_last="link"), tmp_path)
    assert not checkpoints.exists() or not any(checkpoints.iterdir())


def test_lightnings_own_callback_saves_the_untrained_model(tmp_path: Path) -> None:
    """The control: without the refusal, the same fit leaves a last.ckpt."""
    checkpoints = tmp_path / "checkpoints"
    _fit_on_nothing(ModelCheckpoint(dirpath=checkpoints, save_last="link"), tmp_path)
    assert (checkpoints / "last.ckpt").is_file()
