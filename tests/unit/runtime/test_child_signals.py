"""Children never run a signal handler of their parent (``core/signals.py``): not one that
arrives before the child has reset its handlers (the start-up window), and not in the
loader's workers and collate process while they work (submitit's SIGUSR2 handler, which
requeues the job, ran there)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from odb_lightning.core.signals import IGNORED, reset_inherited_handlers, signals_held
from odb_lightning.runtime import ODBLoader
from testing.harness.datasets import SyntheticChatDataset


@pytest.fixture
def parent_handler(tmp_path: Path) -> Iterator[Path]:
    """A handler for every stop signal in this process that writes the pid it runs in."""
    runs = tmp_path / "handler_runs"

    def handler(signum: int, _: object) -> None:
        with runs.open("a") as out:
            out.write(f"{os.getpid()} {signum}\n")

    previous = {signum: signal.signal(signum, handler) for signum in (*IGNORED, signal.SIGHUP)}
    try:
        yield runs
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _signalled_before_reset(out: Connection) -> None:
    # The first thing this child does: signal itself, before it resets anything.
    for signum in (*IGNORED, signal.SIGHUP):
        os.kill(os.getpid(), signum)
    out.send("sent")
    reset_inherited_handlers()  # SIGHUP, pending, ends the child here with its default


def test_a_signal_in_the_start_up_window_never_runs_the_parents_handler(
    parent_handler: Path,
) -> None:
    """The signals a forked child gets before its reset wait, blocked since its start: then
    they meet the child's own dispositions (SIGINT/USR1/USR2 ignored; SIGHUP's default ends
    it). (A spawned child inherits no Python handler.)"""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_signalled_before_reset, args=(send,))
    with signals_held():
        child.start()
    send.close()
    assert receive.recv() == "sent"
    child.join(60)
    assert child.exitcode == -signal.SIGHUP  # its default action, not the parent's handler
    assert not parent_handler.exists(), parent_handler.read_text()


def test_the_loader_processes_ignore_stop_signals_and_run_no_inherited_handler(
    parent_handler: Path,
) -> None:
    """SIGUSR2 (submitit's requeue signal), SIGUSR1 and SIGINT sent to every worker and the
    collate process mid-epoch: the epoch goes on to its end with every sample, and the
    parent's handler ran in no child."""
    dataset = SyntheticChatDataset.seeded(400)
    with ODBLoader(
        dataset, token_budget=600, outstanding_depth=32, num_workers=2,
        multiprocessing_context="fork",
    ) as loader:  # fmt: skip
        batches = iter(loader)
        ids = list(next(batches).meta.sample_ids)
        children = loader.child_pids()
        assert len(children) == 3
        for pid in children.values():
            for signum in IGNORED:
                os.kill(pid, signum)
        ids += [i for batch in batches for i in batch.meta.sample_ids]
        assert loader.child_pids() == children, "no child died"
    assert sorted(ids) == list(range(len(dataset)))
    assert not parent_handler.exists(), parent_handler.read_text()
