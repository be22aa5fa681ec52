"""A 2-rank ``train.py`` run keeps to itself: it writes only into its output directory
and its record cache (the working directory holds nothing but the one record table of its
file afterwards, ``HOME`` and ``TMPDIR`` are empty directories before and after),
listens only on the job's store and its Gloo groups (the ODB metadata channel meets on
the job's store: no port of its own), and a record whose
preprocessing raises is skipped and counted under ``batching.loader.on_bad_sample=skip``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from helpers.train_run import ROOT
from testing.harness.processes import listening_sockets
from testing.harness.train_faults import run_train_fault

TRIGGER = "TRIGGER-PREPROCESSING-FAILURE"  # RaisingTokenizer's default
NUM_RECORDS = 40
RAISING = (5, 17)
WILDCARDS = {"0.0.0.0", "::"}
# Not ours: torchmetrics imports matplotlib where it is installed (the bench extra), and
# matplotlib creates its config directory and font cache in HOME on first import
# (MPLCONFIGDIR moves them). Nothing else may appear.
THIRD_PARTY_HOME = {".cache", ".config", ".cache/matplotlib", ".config/matplotlib"}
THIRD_PARTY_HOME_FILES = ".cache/matplotlib/fontlist-"
# Not ours either: importing torch._dynamo (Lightning does) creates its cache directory,
# empty, in TMPDIR, unless TORCHINDUCTOR_CACHE_DIR is already set (that import in the test
# process sets it, and the run would inherit it).
THIRD_PARTY_TEMP = re.compile(r"torchinductor_[^/]+")


def write_chats(path: Path) -> None:
    with path.open("w", encoding="utf-8") as out:
        for index in range(NUM_RECORDS):
            answer = TRIGGER if index in RAISING else f"answer {index} " * (3 + index % 7)
            messages = [
                {"role": "user", "content": f"question {index}?"},
                {"role": "assistant", "content": answer},
            ]
            out.write(json.dumps({"id": f"chat-{index}", "messages": messages}) + "\n")


def file_tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _check_sockets(probe: dict, rank_pids: set[int]) -> None:
    """The job's store on rank 0; otherwise one Gloo listener per group member: the
    training group in each rank, the metadata channel in each collate process; none in
    the workers."""
    stores = {probe["master_port"]}
    by_pid: dict[int, set[int]] = defaultdict(set)
    for socket in probe["listening"]:
        by_pid[socket["pid"]].add(socket["port"])
        if socket["port"] not in stores:
            assert socket["host"] not in WILDCARDS, socket  # a Gloo pair, one interface
    parent = {s["pid"]: s["ppid"] for s in probe["listening"]}
    opened = {pid: ports - by_pid.get(parent[pid], set()) for pid, ports in by_pid.items()}
    ranks = {pid: ports for pid, ports in opened.items() if pid in rank_pids}
    children = {pid: ports for pid, ports in opened.items() if pid not in rank_pids}
    assert len(ranks) == 2
    for pid, ports in ranks.items():
        assert len(ports - stores) == 1, (pid, ports)  # the training group's listener
    # Forked children inherit their rank's sockets; only the collate process opens one.
    assert sorted(len(ports) for ports in children.values() if ports) == [1, 1], opened
    all_ports = set().union(*by_pid.values())
    assert all_ports == stores | set().union(*opened.values())
    assert len(all_ports) == 1 + 4


@pytest.mark.slow
def test_run_stays_in_its_directory_and_skips_a_raising_record(tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    write_chats(data)
    cwd, home, temp = (tmp_path / name for name in ("cwd", "home", "tmpdir"))
    for directory in (cwd, home, temp):
        directory.mkdir()
    result = run_train_fault(
        tmp_path / "job",
        "none",
        0,
        "data=jsonl",
        f"data.source.path={data}",
        "data.sizes.max_samples=null",
        "batching.loader.on_bad_sample=skip",
        "audit_ids=true",
        "tokenizer._target_=testing.harness.fault_injection.RaisingTokenizer",
        env={"HOME": str(home), "TMPDIR": str(temp)},
        cwd=cwd,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert result.leftover_pids == [] and len(result.job_pids) == 6
    run_dir = tmp_path / "job" / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["skipped_bad_samples"] == len(RAISING)
    assert summary["skipped_sample_ids"] == sorted(RAISING)
    assert summary["emitted_samples"] == NUM_RECORDS - len(RAISING)
    audit = [
        i for r in range(2) for line in (run_dir / f"emitted_ids_rank{r}.jsonl").open()
        for i in json.loads(line)["indices"]
    ]  # fmt: skip
    assert sorted(audit) == sorted(set(range(NUM_RECORDS)) - set(RAISING))  # once each
    records = ".cache/odb_lightning/records"  # data.caches.record_dir: one table, two ranks
    (entry,) = [p.name for p in (cwd / records).iterdir() if p.is_dir()]
    tree = [".cache", ".cache/odb_lightning", records, f"{records}/{entry}"]
    tree += [f"{records}/{entry}.lock", f"{records}/{entry}/records.arrow"]
    assert file_tree(cwd) == sorted([*tree, f"{records}/{entry}/source.json"])
    assert [p for p in file_tree(temp) if not THIRD_PARTY_TEMP.fullmatch(p)] == []
    ours = [
        p for p in file_tree(home)
        if p not in THIRD_PARTY_HOME and not p.startswith(THIRD_PARTY_HOME_FILES)
    ]  # fmt: skip
    assert ours == []
    probes = [json.loads(p.read_text()) for p in result.probe_dir.glob("probe_rank*.json")]
    _check_sockets(json.loads((result.probe_dir / "sockets.json").read_text()),
                   {probe["pid"] for probe in probes})  # fmt: skip


def test_source_has_no_fixed_temp_paths() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "/tmp" in line or "gettempdir" in line
    ]
    assert offenders == []


def test_listening_sockets_probe_sees_a_listener(tmp_path: Path) -> None:
    import os
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        found = listening_sockets([os.getpid()])
    assert {"pid": os.getpid(), "ppid": os.getppid(), "host": "127.0.0.1", "port": port} in found
