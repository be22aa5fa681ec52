"""Stop mid-epoch, resume from the checkpoint, count what each run emitted.

For each batching mode and world size: `train.py debug=smoke trainer.max_steps=K
callbacks.checkpoint.every_n_train_steps=K audit_ids=true`, then `train.py ckpt_path=...
trainer.max_steps=-1 callbacks.checkpoint.every_n_train_steps=null` to the end of the
epoch; the id audits of both runs give the samples emitted before and after the
checkpoint, the duplicates and the missing ones against the epoch's 64 training samples.

    python -m experiments.resume.run [--stop-at 3] [--modes odb,standard,bucketed]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

from experiments.common import results_meta, run_train
from odb_lightning.core.order import epoch_permutation

HERE = Path(__file__).resolve().parent
TRAIN_INDICES = sorted(epoch_permutation(80, 0, -1)[16:])  # debug=smoke: 64 train records
SMOKE = ["debug=smoke", "audit_ids=true"]


def emitted(run_dir: Path) -> Counter[int]:
    counts: Counter[int] = Counter()
    for audit in run_dir.glob("emitted_ids_rank*.jsonl"):
        for line in audit.open():
            counts.update(json.loads(line)["indices"])
    return counts


def stop_and_resume(mode: str, trainer: str, stop_at: int, work: Path) -> dict:
    common = [*SMOKE, f"experiment=sharegpt_{mode}", f"trainer={trainer}"]
    common.append(f"data.caches.length_dir={work / 'cache'}")
    first, second = work / f"{mode}_{trainer}_first", work / f"{mode}_{trainer}_second"
    stop = [f"trainer.max_steps={stop_at}", f"callbacks.checkpoint.every_n_train_steps={stop_at}"]
    run_train(first, [*common, *stop])
    # The resume runs with the checkpoint's config: what made the stop is lifted here.
    resume = ["trainer.max_steps=-1", "callbacks.checkpoint.every_n_train_steps=null"]
    resume.append(f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}")
    summary = run_train(second, [*common, *resume])
    before, after = emitted(first), emitted(second)
    total = before + after
    return {
        "mode": mode,
        "trainer": trainer,
        "world_size": 1 if trainer == "cpu" else 2,
        "emitted_before": sum(before.values()),
        "emitted_after": sum(after.values()),
        "duplicates": sum(n - 1 for n in total.values() if n > 1),
        "missing": len(set(TRAIN_INDICES) - set(total)),
        "optimizer_steps_total": summary["optimizer_steps"],
        "summary_emitted_samples": summary["emitted_samples"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop-at", type=int, default=3, help="optimizer steps before the stop")
    parser.add_argument("--modes", default="odb,standard,bucketed")
    parser.add_argument("--trainers", default="cpu,ddp_cpu,fsdp_cpu")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for trainer in args.trainers.split(","):
            for mode in args.modes.split(","):
                row = stop_and_resume(mode, trainer, args.stop_at, Path(scratch))
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {
        "runs": rows,
        "meta": results_meta(epoch_samples=len(TRAIN_INDICES)),
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
