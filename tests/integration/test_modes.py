"""Every batching mode besides odb (covered in test_train.py) in a real 2-rank DDP run:
each sample exactly once, equal step counts on both ranks, and the batch shape the mode
promises: fixed batches of 8, multi-sample batches within the padded-token budget (checked
against the exact lengths of the run's own length cache), or padding-free packed rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.train_run import read_audit, train
from odb_lightning.core.order import epoch_permutation
from odb_lightning.data.length_file import read_length_columns

BUDGET = 4096  # experiment=sharegpt_odb's token budget


def cached_lengths(cache_dir: Path) -> list[int]:
    (path,) = cache_dir.glob("lengths-*.arrow")
    return read_length_columns(path)[1].tolist()


@pytest.mark.parametrize(
    "experiment",
    # Slow: a 2-rank train.py job per mode, about 25 s each; the default tier's 2-rank
    # train.py jobs are the SIGTERM test (ODB) and test_sharded_checkpoints (FSDP2).
    [
        pytest.param("oracle", marks=pytest.mark.slow),
        pytest.param("sorted", marks=pytest.mark.slow),
        pytest.param("bucketed", marks=pytest.mark.slow),
        pytest.param("standard", marks=pytest.mark.slow),
        pytest.param("packed", marks=pytest.mark.slow),
    ],
)
def test_mode_under_ddp(experiment: str, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    run_dir = tmp_path / "run"
    summary = train(
        run_dir,
        f"experiment=sharegpt_{experiment}",
        "trainer=ddp_cpu",
        "audit_ids=true",
        f"data.caches.length_dir={cache_dir}",
    )
    audit = read_audit(run_dir, 2)
    assert len(audit[0]) == len(audit[1]) == summary["steps_per_rank"]
    emitted = sorted(i for rank in audit for step in rank for i in step)
    assert emitted == sorted(epoch_permutation(80, 0, -1)[16:])  # debug=smoke split
    steps = [step for rank in audit for step in rank]
    if experiment in ("sorted", "standard"):
        assert all(len(step) == 8 for step in steps)  # 64 samples: 4 batches per rank
    elif experiment == "packed":
        assert summary["padding_efficiency"] == 1.0
    else:
        lengths = cached_lengths(cache_dir)
        for step in steps:
            if len(step) > 1:
                assert len(step) * max(lengths[i] for i in step) <= BUDGET
    if experiment in ("sorted", "bucketed", "oracle"):
        assert summary["length_cache_s"] > 0  # built by this run
