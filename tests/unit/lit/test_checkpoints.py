"""``last.ckpt`` never dangles (atomic link update, outdated checkpoints deleted after
it), a ``last.ckpt`` that does not load resumes from the newest valid checkpoint beside
it, and a resume with other batching settings is warned about and recorded."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from odb_lightning.app.checkpoints import NoValidCheckpointError, resolve_resume_checkpoint
from odb_lightning.core.config import BatchingConfig
from odb_lightning.lit.callbacks.checkpointing import AtomicLinkModelCheckpoint, replace_link
from odb_lightning.lit.data.resume_state import (
    batching_settings,
    pack_state,
    resume_changes,
    unpack_state,
)


# -- the checkpoint callback ---------------------------------------------------------------
class _Killed(BaseException):
    """A SIGKILL at one filesystem step: nothing after it runs."""


def _write_checkpoint(path: str, sharded: bool) -> None:
    if sharded:  # an FSDP2 checkpoint: a directory of shards
        os.makedirs(path)
        Path(path, ".metadata").write_bytes(b"m")
        torch.save({"global_step": 1}, os.path.join(path, "meta.pt"))
    else:
        torch.save({"global_step": 1}, path)


def _fake_trainer(sharded: bool) -> SimpleNamespace:
    trainer = SimpleNamespace(is_global_zero=True, ckpt_path=None, loggers=[], global_step=0)

    def remove_checkpoint(path: str) -> None:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    trainer.strategy = SimpleNamespace(
        barrier=lambda *a, **k: None,
        remove_checkpoint=remove_checkpoint,
        reduce_boolean_decision=lambda decision, **k: decision,
    )
    trainer.save_checkpoint = lambda path, weights_only=False: _write_checkpoint(path, sharded)
    return trainer


def _save(callback: ModelCheckpoint, trainer: SimpleNamespace, step: int) -> None:
    """What ``ModelCheckpoint.on_train_batch_end`` does at a save step."""
    trainer.global_step = step
    candidates = {"epoch": torch.tensor(0), "step": torch.tensor(step)}
    callback._save_topk_checkpoint(trainer, candidates)
    callback._save_last_checkpoint(trainer, candidates)


def _last_is_complete(dirpath: Path) -> bool:
    last = dirpath / "last.ckpt"
    target = last.resolve()
    if target.is_dir():
        return (target / "meta.pt").is_file()
    return target.is_file()


@pytest.fixture
def watched_filesystem(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every removal, rename and link made is logged (name of the call, in order)."""
    calls: list[str] = []
    for module, name in ((os, "remove"), (os, "replace"), (os, "symlink"), (shutil, "rmtree")):
        original = getattr(module, name)

        def wrapped(*args: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            hook = getattr(wrapped_hooks, "before", None)
            if hook is not None:
                hook(_name)
            return _original(*args, **kw)

        monkeypatch.setattr(module, name, wrapped)
    return calls


wrapped_hooks = SimpleNamespace(before=None)


def _run_saves(callback_type: type[ModelCheckpoint], dirpath: Path, sharded: bool) -> None:
    dirpath.mkdir(exist_ok=True)  # what ModelCheckpoint.setup does
    callback = callback_type(dirpath=str(dirpath), save_top_k=1, save_last="link")
    trainer = _fake_trainer(sharded)
    for step in (1, 2, 3):
        _save(callback, trainer, step)


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "fsdp2_directory"])
def test_last_link_never_dangles_during_saves(
    tmp_path: Path, watched_filesystem: list[str], sharded: bool
) -> None:
    seen: list[bool] = []

    def check(_name: str) -> None:
        if (tmp_path / "last.ckpt").is_symlink() or (tmp_path / "last.ckpt").exists():
            seen.append(_last_is_complete(tmp_path))

    wrapped_hooks.before = check
    try:
        _run_saves(AtomicLinkModelCheckpoint, tmp_path, sharded)
    finally:
        wrapped_hooks.before = None
    assert seen and all(seen), "last.ckpt named a deleted checkpoint at some step"
    assert "replace" in watched_filesystem
    # One checkpoint kept, last.ckpt naming it.
    kept = sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink())
    assert kept == ["epoch0-step3.ckpt"]
    assert os.readlink(tmp_path / "last.ckpt") == "epoch0-step3.ckpt"


def test_the_probe_sees_lightnings_dangling_window(
    tmp_path: Path, watched_filesystem: list[str]
) -> None:
    """The check above is not vacuous: Lightning's own callback lets last.ckpt dangle."""
    seen: list[bool] = []
    wrapped_hooks.before = lambda _name: seen.append(
        not (tmp_path / "last.ckpt").is_symlink() or _last_is_complete(tmp_path)
    )
    try:
        _run_saves(ModelCheckpoint, tmp_path, sharded=False)
    finally:
        wrapped_hooks.before = None
    assert not all(seen)


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "fsdp2_directory"])
def test_a_kill_at_any_step_leaves_a_complete_last_checkpoint(
    tmp_path: Path, watched_filesystem: list[str], sharded: bool
) -> None:
    _run_saves(AtomicLinkModelCheckpoint, tmp_path / "count", sharded)
    steps = len(watched_filesystem)
    for kill_at in range(steps):
        dirpath = tmp_path / f"kill{kill_at}"
        count = iter(range(steps + 1))

        def kill(_name: str, _at: int = kill_at, _count: Any = count) -> None:
            if next(_count) == _at:
                raise _Killed

        wrapped_hooks.before = kill
        try:
            with pytest.raises(_Killed):
                _run_saves(AtomicLinkModelCheckpoint, dirpath, sharded)
        finally:
            wrapped_hooks.before = None
        if (dirpath / "last.ckpt").is_symlink():
            assert _last_is_complete(dirpath), f"killed at step {kill_at}"
            assert resolve_resume_checkpoint(dirpath / "last.ckpt") == str(dirpath / "last.ckpt")


def test_replace_link_over_a_copied_checkpoint_directory(tmp_path: Path) -> None:
    _write_checkpoint(str(tmp_path / "new.ckpt"), sharded=True)
    _write_checkpoint(str(tmp_path / "last.ckpt"), sharded=True)  # a real directory
    replace_link(str(tmp_path / "new.ckpt"), str(tmp_path / "last.ckpt"))
    assert os.readlink(tmp_path / "last.ckpt") == "new.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "new.ckpt"]


# -- resolving the checkpoint a resume loads -------------------------------------------------
def _aged(path: Path, age_s: float) -> Path:
    stamp = 1_700_000_000 - age_s
    os.utime(path, (stamp, stamp), follow_symlinks=False)
    return path


def test_a_dangling_last_ckpt_resumes_from_the_newest_valid_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_checkpoint(str(tmp_path / "epoch=0-step=2.ckpt"), sharded=False)
    _aged(tmp_path / "epoch=0-step=2.ckpt", 20)
    _write_checkpoint(str(tmp_path / "epoch=0-step=3.ckpt"), sharded=False)
    _aged(tmp_path / "epoch=0-step=3.ckpt", 10)
    (tmp_path / "epoch=0-step=4.ckpt").write_bytes(b"truncated")  # newest, corrupt
    os.symlink("epoch=0-step=1.ckpt", tmp_path / "last.ckpt")  # deleted
    with caplog.at_level(logging.WARNING):
        chosen = resolve_resume_checkpoint(str(tmp_path / "last.ckpt"))
    assert chosen == str(tmp_path / "epoch=0-step=3.ckpt")
    assert "resuming from" in caplog.text and "epoch=0-step=3.ckpt instead of" in caplog.text
    assert "links to epoch=0-step=1.ckpt, which does not exist" in caplog.text


def test_a_corrupt_last_ckpt_resumes_from_a_sharded_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(b"not a checkpoint")
    _write_checkpoint(str(tmp_path / "epoch=0-step=3.ckpt"), sharded=True)
    partial = tmp_path / "epoch=0-step=4.ckpt"  # a sharded save killed midway
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"x")
    _aged(tmp_path / "epoch=0-step=3.ckpt" / "meta.pt", 50)
    _aged(tmp_path / "epoch=0-step=3.ckpt" / ".metadata", 50)
    assert resolve_resume_checkpoint(tmp_path / "last.ckpt") == str(
        tmp_path / "epoch=0-step=3.ckpt"
    )


def test_no_valid_checkpoint_names_the_directory_and_what_it_holds(tmp_path: Path) -> None:
    os.symlink("epoch=0-step=1.ckpt", tmp_path / "last.ckpt")
    (tmp_path / "epoch=0-step=2.ckpt").write_bytes(b"truncated")
    with pytest.raises(NoValidCheckpointError) as raised:
        resolve_resume_checkpoint(tmp_path / "last.ckpt")
    message = str(raised.value)
    assert f"no other checkpoint in {tmp_path} loads" in message
    assert "epoch=0-step=2.ckpt (it is not a torch checkpoint" in message


def test_a_valid_last_ckpt_and_other_paths_are_kept(tmp_path: Path) -> None:
    _write_checkpoint(str(tmp_path / "epoch=0-step=3.ckpt"), sharded=False)
    os.symlink("epoch=0-step=3.ckpt", tmp_path / "last.ckpt")
    assert resolve_resume_checkpoint(tmp_path / "last.ckpt") == str(tmp_path / "last.ckpt")
    assert resolve_resume_checkpoint(None) is None
    missing = tmp_path / "other.ckpt"  # named here, before Lightning would fail on it
    with pytest.raises(NoValidCheckpointError, match=r"other\.ckpt does not exist: pass as"):
        resolve_resume_checkpoint(missing)


# -- batching settings of a resume -----------------------------------------------------------
def test_a_resume_with_another_budget_and_window_warns_naming_each_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    saved = BatchingConfig.of(token_budget=4096, outstanding_depth=128)
    state = pack_state({"source": "x"}, 1, {"epoch": 0}, batching_settings(saved))
    restored = torch.load(_roundtrip(state), weights_only=True)
    now = batching_settings(BatchingConfig.of(token_budget=8192, outstanding_depth=64))
    with caplog.at_level(logging.WARNING):
        assert unpack_state(restored, {"source": "x"}, 1) == {"epoch": 0}
        changed = resume_changes(restored, now)
    assert changed == {
        "token_budget": {"old": 4096, "new": 8192},
        "outstanding_depth": {"old": 128, "new": 64},
    }
    assert "token_budget: 4096 -> 8192, outstanding_depth: 128 -> 64" in caplog.text
    assert resume_changes(restored, batching_settings(saved)) == {}
    assert resume_changes({"format": 1}, now) == {}  # a checkpoint from before the record


def _roundtrip(state: dict[str, Any]) -> Any:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("keep_last", [1, 2, 3])
def test_keep_last_keeps_the_newest_checkpoints(tmp_path: Path, keep_last: int) -> None:
    """``callbacks.checkpoint.keep_last=N`` (HF's ``save_total_limit``): after 5 saves the
    newest N checkpoints are on disk, ``last.ckpt`` naming the newest."""
    callback = AtomicLinkModelCheckpoint(
        dirpath=str(tmp_path), keep_last=keep_last, save_last="link"
    )
    trainer = _fake_trainer(sharded=False)
    for step in range(1, 6):
        _save(callback, trainer, step)
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name != "last.ckpt")
    assert kept == [f"epoch0-step{s}.ckpt" for s in range(6 - keep_last, 6)]
    assert (tmp_path / "last.ckpt").resolve().name == "epoch0-step5.ckpt"


@pytest.mark.parametrize("keep_last", [0, -2, 1.5])
def test_keep_last_refuses_a_count_it_cannot_keep(keep_last: object) -> None:
    with pytest.raises(ValueError, match=r"callbacks.checkpoint.keep_last must be an integer"):
        AtomicLinkModelCheckpoint(keep_last=keep_last)  # type: ignore[arg-type]
