"""A Hydra multirun sweep whose jobs train with 2 DDP processes (``trainer=ddp_cpu``).

Lightning's subprocess launcher starts rank 1 by re-running ``train.py`` with the same
arguments, ``-m`` included, plus ``hydra.run.dir=<rank 0's resolved run dir>``: rank 1
runs the whole sweep itself, job by job in step with rank 0 (rank 0 spawns it only in the
first job; later jobs find ``LOCAL_RANK`` set and reuse the process group). For rank 1 to
write into rank 0's job directories, the sweep dir must resolve the same in both
processes, which is why ``conf/train.yaml`` derives it from ``hydra.run.dir``. This test
runs the sweep with that default sweep dir (from a scratch working directory), so a sweep
dir resolved again in rank 1 (``${now:}`` a few seconds later) would fail it.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from odb_lightning.core.order import epoch_permutation

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = [2048, 4096]
# debug=smoke reads 80 records and holds out a seeded 16 for validation; the id audit names
# dataset indices, so a job must emit exactly the other 64, once each over both ranks.
TRAIN_INDICES = sorted(epoch_permutation(80, 0, -1)[16:])
TRAIN_SAMPLES = len(TRAIN_INDICES)


@pytest.mark.slow  # two 2-rank training jobs: about 40-80 s on 2 cores
def test_multirun_sweep_with_ddp_children(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "debug=smoke",
        "trainer=ddp_cpu",
        f"batching.token_budget={','.join(map(str, BUDGETS))}",
        "audit_ids=true",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=540, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    # Every file of the sweep, both ranks', lies in one sweep dir: the jobs' summaries
    # and each rank's audit file, nothing in a second directory.
    (sweep_dir,) = {p.parent for p in tmp_path.rglob("multirun.yaml")}
    summaries = sorted(tmp_path.rglob("summary.json"))
    audits = sorted(tmp_path.rglob("emitted_ids_rank*.jsonl"))
    assert [p.relative_to(sweep_dir) for p in summaries] == [
        Path(str(job), "summary.json") for job in range(len(BUDGETS))
    ]
    assert [p.relative_to(sweep_dir) for p in audits] == [
        Path(str(job), f"emitted_ids_rank{rank}.jsonl")
        for job in range(len(BUDGETS))
        for rank in range(2)
    ]
    steps_per_job = []
    for job, budget in enumerate(BUDGETS):
        job_dir = sweep_dir / str(job)
        summary = json.loads((job_dir / "summary.json").read_text())
        assert summary["token_budget"] == budget
        assert summary["world_size"] == 2
        assert summary["emitted_samples"] == TRAIN_SAMPLES == summary["train_samples"]
        assert summary["dropped_samples"] == 0
        ranks = [
            [
                json.loads(line)["indices"]
                for line in (job_dir / f"emitted_ids_rank{r}.jsonl").open()
            ]
            for r in range(2)
        ]
        # Both ranks ran this job (rank 1 in its own process, with the same sweep value):
        # equal step counts, every training sample exactly once over the two ranks.
        assert len(ranks[0]) == len(ranks[1]) == summary["steps_per_rank"]
        assert sorted(i for rank in ranks for step in rank for i in step) == TRAIN_INDICES
        assert [r["samples"] for r in summary["per_rank"]] == [
            sum(len(step) for step in rank) for rank in ranks
        ]
        steps_per_job.append(summary["steps_per_rank"])
    # The sweep value took effect: a doubled budget packs the same samples in fewer steps.
    assert steps_per_job[1] < steps_per_job[0]
    # The comparison at the sweep's root, written by rank 0 alone (rank 1's process runs
    # the same Hydra callbacks).
    with (sweep_dir / "summary_table.csv").open() as rows:
        table = list(csv.DictReader(rows))
    assert [int(row["batching.token_budget"]) for row in table] == BUDGETS
    assert [int(row["optimizer_steps"]) for row in table] == steps_per_job
    assert [row["status"] for row in table] == ["ok", "ok"]
