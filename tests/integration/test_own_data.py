"""A user's own JSON Lines file, as small as a first try: it trains with the file's own
sizes, and the summary, the table and the id audit say what happened to every line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.own_data import write_own_jsonl
from helpers.train_run import ROOT, read_audit, read_audit_ids


def test_small_own_jsonl_counts_bad_lines_truncation_and_audits_record_ids(
    tmp_path: Path,
) -> None:
    data = tmp_path / "mine.jsonl"
    ids = write_own_jsonl(data, num_short=15, num_long=5)  # 20 good records, 1 bad line
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "train.py",
        f"hydra.run.dir={run_dir}",
        "debug=smoke",
        "data=jsonl",
        f"data.source.path={data}",
        "data.sizes.max_seq_len=64",
        "batching.loader.on_bad_sample=skip",
        "audit_ids=true",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # debug=smoke holds out a fraction (0.2) of what the file has: 4 of 20, 16 train.
    assert summary["train_samples"] == 16 == summary["emitted_samples"]
    assert summary["source_records"] == {"read": 21, "dropped/bad_record": 1, "kept": 20}
    assert summary["skipped_bad_records"] == 1 and summary["skipped_bad_samples"] == 0
    assert "skipped bad records (source lines) │ 1 │" in " ".join(done.stdout.split())
    # The audit names the records by their own ids, each training record once, and
    # keeps the dataset indices beside them.
    (id_steps,), (index_steps,) = read_audit_ids(run_dir, 1), read_audit(run_dir, 1)
    emitted = [i for step in id_steps for i in step]
    assert len(emitted) == len(set(emitted)) == 16 and set(emitted) <= set(ids)
    by_index = {i: record_id for i, record_id in enumerate(ids)}
    flat = [i for step in index_steps for i in step]
    assert [by_index[i] for i in flat] == emitted
    # Every over-long record that trained was cut to max_seq_len and counted.
    assert summary["truncated_samples"] == sum(i.startswith("long-") for i in emitted) > 0
    assert f"truncated records │ {summary['truncated_samples']} │" in " ".join(done.stdout.split())
    # The skipped line is named in the run directory, and the log says where.
    listed = [json.loads(line) for line in (run_dir / "skipped_records.jsonl").open()]
    assert listed == [
        {
            "source": "jsonl",
            "record": f"{data}:3",
            "reason": listed[0]["reason"],
        }
    ]
    assert listed[0]["reason"].startswith("field '<line>': invalid JSON")
    log = " ".join(done.stderr.split())
    assert f"each one named in {run_dir / 'skipped_records.jsonl'}" in log
    # debug=smoke read the whole file (21 lines, fewer than its 80): it says nothing of a
    # partial read.
    assert "the rest is not checked" not in log
