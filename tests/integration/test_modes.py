"""Every length-pass mode in a real 2-rank DDP run: each sample exactly once, equal step
counts on both ranks, and every multi-sample batch within the budget the mode promises.

Lengths come from the run's own length cache, so the budget check uses the exact
post-pipeline lengths the planner saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train import read_audit, train

from odb_lightning.core.order import epoch_permutation

BUDGET = 4096  # experiment=sharegpt_odb's token budget


def cached_lengths(cache_dir: Path) -> list[int]:
    (path,) = cache_dir.glob("lengths-*.json")
    return json.loads(path.read_text().splitlines()[1])["lengths"]


@pytest.mark.parametrize(
    "mode",
    [
        "oracle",
        pytest.param("sorted", marks=pytest.mark.slow),
        pytest.param("bucketed", marks=pytest.mark.slow),
    ],
)
def test_length_pass_mode_under_ddp(mode: str, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    run_dir = tmp_path / "run"
    summary = train(
        run_dir,
        f"experiment=sharegpt_{mode}",
        "trainer=ddp_cpu",
        "audit_ids=true",
        f"data.length_cache_dir={cache_dir}",
    )
    audit = read_audit(run_dir, 2)
    assert len(audit[0]) == len(audit[1]) == summary["steps_per_rank"]
    emitted = sorted(i for rank in audit for step in rank for i in step)
    assert emitted == sorted(epoch_permutation(80, 0, -1)[16:])  # debug=smoke split
    lengths = cached_lengths(cache_dir)
    for rank in audit:
        for step in rank:
            if mode == "sorted":
                assert len(step) == 8  # 64 training samples: fixed batches of 8, no IDLE
            elif len(step) > 1:
                assert len(step) * max(lengths[i] for i in step) <= BUDGET
    assert summary["length_cache_s"] > 0  # built by this run
