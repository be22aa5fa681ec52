"""The scale study's measuring parts: sizes, the per-rank PSS of a process tree, the
start-up figures read from the probes' files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.scale_data.run import TreeWatcher, merged, parse_size, size_label, startup_figures

MIB = 1 << 20
# A process that holds 96 MiB and starts a child for rank 1 that holds 48 MiB; both say
# "ready" once their memory is touched, then wait for their stdin to close.
TREE = """
import os, subprocess, sys
held = bytearray(96 * 2**20)
code = "import sys; held = bytearray(48 * 2**20); print('ready', flush=True); sys.stdin.read()"
child = subprocess.Popen(
    [sys.executable, "-c", code],
    env=dict(os.environ, LOCAL_RANK="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
child.stdout.readline()
print("ready", flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


@pytest.mark.parametrize(
    ("text", "n"), [("10k", 10_000), ("1M", 1_000_000), ("2500", 2500), ("0.5k", 500)]
)
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n
    assert parse_size(size_label(n)) == n


def test_watcher_sums_each_ranks_tree() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK")}
    root = subprocess.Popen(
        [sys.executable, "-c", TREE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert root.stdout.readline().strip() == "ready"
        watcher = TreeWatcher([root.pid], interval_s=60.0)
        watcher.sample()  # both processes hold their memory now
    finally:
        root.stdin.close()
        root.wait(timeout=60)
    assert set(watcher.peak_by_rank) == {0, 1} and watcher.max_processes == 2
    assert 96 * MIB <= watcher.peak_by_rank[0] <= 96 * MIB + 200 * MIB
    assert 48 * MIB <= watcher.peak_by_rank[1] <= 48 * MIB + 200 * MIB
    assert watcher.peak_total == sum(watcher.peak_by_rank.values())


def test_startup_figures_take_the_slowest_rank(tmp_path: Path) -> None:
    started = 1000.0
    for rank, offset in ((0, 0.0), (1, 2.5)):
        marks = {"first_batch_requested": 1010 + offset, "first_batch": 1011 + offset,
                 "first_step": 1012 + offset}  # fmt: skip
        (tmp_path / f"startup_rank{rank}.json").write_text(json.dumps({"marks": marks}))
    figures = startup_figures(tmp_path, started, ranks=2)
    assert figures["startup_s"] == 12.5 and figures["first_step_s"] == 14.5
    assert figures["first_step_s_by_rank"] == [12.0, 14.5] and figures["window_fill_s"] == 2.0
    assert "error" in startup_figures(tmp_path, started, ranks=3)


def test_results_merge_by_key() -> None:
    old = [{"records": 10, "arm": "odb", "v": 1}, {"records": 100, "arm": "odb", "v": 2}]
    new = [{"records": 100, "arm": "odb", "v": 3}]
    assert merged(old, new, ("records", "arm")) == [old[0], new[0]]
