"""The run directory's lock and link check (app/run_guard.py), and a launched rank's end
with its launcher (app/job_lifetime.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from odb_lightning.app.job_lifetime import LAUNCHER_GONE_EXIT_CODE, LAUNCHER_PID
from odb_lightning.app.run_guard import (
    LOCK_FILE,
    PlantedLinkError,
    RunDirInUseError,
    RunDirLock,
    check_no_planted_links,
    planted_links,
)


def test_a_second_lock_names_the_holder_and_the_first_release_frees_it(tmp_path: Path) -> None:
    first = RunDirLock(tmp_path)
    first.acquire()
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
    with pytest.raises(RunDirInUseError) as refused:
        RunDirLock(tmp_path).acquire()  # a second open file description: flock refuses it
    message = str(refused.value)
    assert f"the run directory {tmp_path} is in use by another run: pid {os.getpid()}" in message
    assert f"(started {holder['started']}) holds {tmp_path / LOCK_FILE}" in message
    assert "another hydra.run.dir" in message
    first.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: nothing to take over
    second = RunDirLock(tmp_path)
    second.acquire()
    second.release()


def test_the_lock_of_a_dead_run_is_taken_over_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = {"pid": 999999, "host": "node7", "started": "2026-12-01T10:00:00+00:00"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(dead))  # written, never unlocked: killed
    lock = RunDirLock(tmp_path)
    with caplog.at_level(logging.WARNING):
        lock.acquire()
    assert (
        f"taking over the lock of the run directory {tmp_path}: pid 999999 on host node7 "
        "(started 2026-12-01T10:00:00+00:00) ended without releasing it"
    ) in caplog.text
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_links_where_the_run_writes_are_refused_its_own_are_not(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "epoch0-step1.ckpt").write_bytes(b"x")
    (run / "checkpoints" / "last.ckpt").symlink_to("epoch0-step1.ckpt")  # the run's own
    (run / "wandb").mkdir()
    (run / "wandb" / "latest-run").symlink_to(victim)  # W&B's own
    assert planted_links(run) == []
    check_no_planted_links(run)
    (run / "checkpoints" / "epoch0-step2.ckpt").symlink_to(victim / "file")
    (run / "train.log").symlink_to(victim / "log")
    assert sorted(planted_links(run)) == [
        run / "checkpoints" / "epoch0-step2.ckpt", run / "train.log",
    ]  # fmt: skip
    with pytest.raises(PlantedLinkError, match="symbolic link where the run writes: .* -> "):
        check_no_planted_links(run)


def test_a_linked_lock_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PlantedLinkError, match=f"rm {tmp_path / LOCK_FILE}"):
        RunDirLock(tmp_path).acquire()
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_a_launched_rank_whose_launcher_is_gone_exits_at_once() -> None:
    """A rank that finds its parent is not the launcher named in its environment (the
    launcher died while it imported) exits instead of waiting for a store that is gone."""
    code = "from odb_lightning.app.job_lifetime import end_with_launcher; end_with_launcher()"
    env = {**os.environ, "LOCAL_RANK": "1", LAUNCHER_PID: "1"}  # pid 1 is not our parent
    env.pop("TORCHELASTIC_RUN_ID", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == LAUNCHER_GONE_EXIT_CODE == 128 + signal.SIGKILL
    assert "the process that started it (pid 1, the job's first rank) is gone" in done.stderr
    same = subprocess.run(
        [sys.executable, "-c", code], env={**env, LAUNCHER_PID: str(os.getpid())}, timeout=60
    )
    assert same.returncode == 0  # started by the launcher it names: armed, running on


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_a_launched_rank_dies_with_its_launcher() -> None:
    """A launcher (its own process) starts a rank as Lightning's launcher does, then is
    killed by SIGTERM's default action: the rank, which would wait for good, is gone."""
    rank = (
        "from odb_lightning.app.job_lifetime import end_with_launcher; "
        "end_with_launcher(); import time; time.sleep(600)"
    )
    launcher = (
        "import os, subprocess, sys, time\n"
        "from odb_lightning.app.job_lifetime import mark_launcher\n"
        "mark_launcher()\n"
        f"child = subprocess.Popen([sys.executable, '-c', {rank!r}], "
        "env={**os.environ, 'LOCAL_RANK': '1'})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")}
    parent = subprocess.Popen(
        [sys.executable, "-c", launcher], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == -signal.SIGTERM
        _, alive = psutil.wait_procs([child], timeout=60)
    finally:
        parent.kill()
    assert alive == [], "the rank outlived its launcher"
