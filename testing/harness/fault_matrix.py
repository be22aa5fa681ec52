"""The loader-level fault matrix at 2 ranks.

Each fault runs ``ODBLoader`` on two real ranks (gloo default group, 2 workers each, the
metadata channel over Gloo) and injects one fault on rank 1, the shorter shard. A run
yields, per rank, the error it raised and the seconds from the fault to that error, and
the PIDs of every process of the job (ranks and their descendants, recorded before the
fault) that were still running afterwards. ``tests/integration/test_runtime_faults.py``
asserts the bounds once per fault; ``experiments/faults/run.py`` times each three times.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing.harness.datasets import SyntheticChatDataset, read_fault_marker
from testing.harness.processes import kill_leftovers, wait_all_gone
from testing.harness.ranks import Kill, KillTarget, RankJob, run_ranks

NUM_SAMPLES = 600
LOADER = {
    "token_budget": 600,
    "outstanding_depth": 32,
    "max_steps_per_round": 4,
    "multiprocessing_context": "fork",
    "num_workers": 2,
    "alignment_timeout_s": 30.0,
}
HANG_TIMEOUT_S = 2.0
"""``timeout_s`` of the hanging-sample fault: its error comes this long after the hang."""
ORPHAN_WAIT_S = 10.0
"""Processes of the job still running this long after the ranks returned are orphans."""


def rank1_sample() -> int:
    """The shortest sample: under ``weights=(1, 3)`` it is in rank 1's shard."""
    lengths = SyntheticChatDataset.seeded(NUM_SAMPLES).lengths
    return min(range(NUM_SAMPLES), key=lambda i: (lengths[i], -i))


def _job(marker: Path, loader: dict[str, Any] | None = None, **fields: Any) -> RankJob:
    dataset_fields = fields.pop("dataset", {})
    dataset = SyntheticChatDataset.seeded(NUM_SAMPLES, fault_marker=str(marker), **dataset_fields)
    return RankJob(dataset, {**LOADER, **(loader or {})}, weights=(1, 3), **fields)


@dataclass(frozen=True)
class Expected:
    """The error a rank must raise: its class name and a regex its message matches."""

    error: str
    pattern: str


@dataclass(frozen=True)
class LoaderFault:
    """One row of the matrix.

    Attributes:
        name: Short name (the results key).
        build: Builds the job, given the file the dataset marks the fault time in.
        expected: Per rank that must raise, what it raises (none: the run completes).
        from_marker: The fault time is the dataset's marker (a sample that hangs or
            raises), not the time the harness injected a kill.
    """

    name: str
    build: Callable[[Path], RankJob]
    expected: dict[int, Expected]
    from_marker: bool = False


CHANNEL_FAILED = r"the ODB metadata channel \(.+\) failed on rank 0 at epoch 0 round \d+"
PEER_FAILED = r"rank\(s\) \[1\] failed"


def matrix() -> list[LoaderFault]:
    """Every fault of the matrix (built fresh: the sample indices depend on the data)."""
    index = rank1_sample()
    return [
        LoaderFault(
            "worker_killed",
            lambda m: _job(m, kill=Kill(KillTarget.WORKER)),
            {
                1: Expected(
                    "LoaderProcessError",
                    r"ODB worker 0 \(pid \d+\) of rank 1 was killed by SIGKILL",
                ),
                0: Expected("MetadataChannelError", CHANNEL_FAILED),
            },
        ),
        LoaderFault(
            "collate_killed",
            lambda m: _job(m, kill=Kill(KillTarget.COLLATE)),
            {
                1: Expected(
                    "LoaderProcessError",
                    r"ODB collate process \(pid \d+\) of rank 1 was killed by SIGKILL",
                ),
                0: Expected("MetadataChannelError", CHANNEL_FAILED),
            },
        ),
        LoaderFault(
            "rank_killed",
            lambda m: _job(m, kill=Kill(KillTarget.RANK)),
            {0: Expected("MetadataChannelError", CHANNEL_FAILED)},
        ),
        LoaderFault(
            "sample_hangs",
            lambda m: _job(m, {"timeout_s": HANG_TIMEOUT_S}, dataset={"hang_index": index}),
            {
                1: Expected(
                    "SampleTimeoutError",
                    rf"no sample arrived from the workers within timeout_s={HANG_TIMEOUT_S}; "
                    rf"\d+ in flight, oldest first: index {index} \(worker \d\)",
                ),
                0: Expected("PeerFailedError", PEER_FAILED),
            },
            from_marker=True,
        ),
        LoaderFault(
            "sample_raises",
            lambda m: _job(m, dataset={"fail_index": index}),
            {
                1: Expected(
                    "SampleFetchError", rf"dataset\[{index}\] raised ZeroDivisionError.*rank 1"
                ),
                0: Expected("PeerFailedError", PEER_FAILED),
            },
            from_marker=True,
        ),
        LoaderFault(
            "sample_raises_skip",
            lambda m: _job(m, {"on_bad_sample": "skip"}, dataset={"fail_index": index}),
            {},
            from_marker=True,
        ),
    ]


@dataclass
class FaultResult:
    """One run of one fault.

    Attributes:
        name: The fault.
        errors: Per rank that raised: ``(class name, message)``.
        seconds_to_error: Per rank that raised: seconds from the fault to its error.
        seconds_to_all_gone: Seconds from the fault until every process of the job had
            exited (``None``: some had not within :data:`ORPHAN_WAIT_S`).
        job_pids: How many processes the job had (ranks and descendants).
        leftover_pids: Those still running :data:`ORPHAN_WAIT_S` after the ranks returned.
        completed: Per rank that finished the epoch: its epoch records.
        mismatches: How the errors differ from the fault's expectations (empty: as
            expected).
    """

    name: str
    errors: dict[int, tuple[str, str]]
    seconds_to_error: dict[int, float]
    seconds_to_all_gone: float | None
    job_pids: int
    leftover_pids: list[int]
    completed: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)


def _mismatches(fault: LoaderFault, errors: dict[int, tuple[str, str]]) -> list[str]:
    found = []
    for rank in sorted(set(fault.expected) | set(errors)):
        want, got = fault.expected.get(rank), errors.get(rank)
        if want is None or got is None:
            found.append(f"rank {rank}: expected {want}, got {got}")
        elif got[0] != want.error or not re.search(want.pattern, got[1]):
            found.append(f"rank {rank}: expected {want.error} /{want.pattern}/, got {got}")
    return found


def run_fault(fault: LoaderFault, work_dir: Path) -> FaultResult:
    """Run ``fault`` once on 2 ranks (``work_dir`` holds the dataset's fault marker)."""
    marker = work_dir / f"{fault.name}.fault_at"
    marker.unlink(missing_ok=True)
    outcome = run_ranks(fault.build(marker), world_size=2)
    fault_at = read_fault_marker(marker) if fault.from_marker else outcome.fault_at
    assert fault_at is not None, f"{fault.name}: the fault was never injected"
    errors = {rank: (name, message) for rank, (name, message, _) in outcome.errors.items()}
    pids = outcome.all_pids()
    all_gone_at, leftover = wait_all_gone(pids, ORPHAN_WAIT_S)
    kill_leftovers(leftover)
    return FaultResult(
        name=fault.name,
        errors=errors,
        seconds_to_error={r: at - fault_at for r, (_, _, at) in outcome.errors.items()},
        seconds_to_all_gone=None if all_gone_at is None else all_gone_at - fault_at,
        job_pids=len(pids),
        leftover_pids=leftover,
        completed=outcome.ok,
        mismatches=_mismatches(fault, errors),
    )
