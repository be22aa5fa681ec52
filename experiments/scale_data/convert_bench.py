"""Record-table conversion: its time, the main process's PSS after ``setup()``, and the
time of a cached load, for a file of N conversations: JSON Lines, or the same records as
one parquet file (``--kind parquet``).

    PYTHONPATH=src .venv/bin/python -m experiments.scale_data.convert_bench --records 100000
    PYTHONPATH=src .venv/bin/python -m experiments.scale_data.convert_bench --records 1000000 \
        --kind parquet

Each measurement runs in a fresh interpreter (``--probe``), so one does not inherit the
pages of another: ``convert`` is the first ``setup()`` on a file (an empty record cache),
``cached`` the second (a cache hit). The file and the caches live under ``--work-dir``;
results go to ``convert_bench.json`` beside this file. Run it against another checkout's
``src`` (``PYTHONPATH``) to measure that code on the same file: a checkout without a
record cache reads the file into Python objects on every ``setup()``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORDS = [
    *("the", "of", "and", "to", "in", "is", "for", "on", "that", "with"),
    *("as", "by", "this", "be", "are", "from", "at", "or", "it", "an"),
]


def write_jsonl(path: Path, num_records: int, seed: int = 0) -> Path:
    """``num_records`` conversations of 2-6 turns, about 1 KB each (a user's file)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for k in range(num_records):
            messages = []
            for turn in range(rng.choice((2, 2, 4, 6))):
                words = rng.choices(WORDS, k=rng.randint(20, 160))
                role = "user" if turn % 2 == 0 else "assistant"
                messages.append({"role": role, "content": " ".join(words)})
            file.write(json.dumps({"id": f"conv-{k}", "messages": messages}) + "\n")
    return path


def write_parquet(jsonl: Path, path: Path) -> Path:
    """The records of ``jsonl`` as one parquet file (pyarrow's JSON reader, row groups of
    its blocks): the same conversations in the file kind a ``datasets`` user keeps."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pj.read_json(jsonl, read_options=pj.ReadOptions(block_size=64 << 20))
    pq.write_table(table, path, row_group_size=10_000)
    return path


def probe(path: Path, cache_dir: Path) -> dict[str, Any]:
    """One ``setup()`` of an ``odb`` data module on ``path`` in this process."""
    import psutil

    from odb_lightning.core.config import BatchingConfig
    from odb_lightning.data import QwenTokenizer
    from odb_lightning.lit.data.datamodule import ODBDataModule

    batching = BatchingConfig.of(mode="odb", token_budget=16384, num_workers=0)
    data = ODBDataModule.of(
        QwenTokenizer(), batching, name="jsonl", path=str(path), max_seq_len=4096,
        val_samples=0.05, record_dir=str(cache_dir),
    )  # fmt: skip
    before = psutil.Process().memory_full_info().pss
    start = time.perf_counter()
    data.setup("fit")
    setup_s = time.perf_counter() - start
    pss = psutil.Process().memory_full_info().pss
    result = {
        "setup_s": round(setup_s, 3),
        "pss_mib": round(pss / 2**20, 1),
        "pss_growth_mib": round((pss - before) / 2**20, 1),
        "train_samples": data.num_train_samples,
    }
    # The table alone, on a hit, imports done.
    from odb_lightning.data.sources import source_reader

    start = time.perf_counter()
    data.record_cache.records(source_reader("jsonl", path=path))
    result["table_hit_s"] = round(time.perf_counter() - start, 4)
    return result


def run_probe(path: Path, cache_dir: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "experiments.scale_data.convert_bench", "--probe"]
    command += ["--file", str(path), "--cache-dir", str(cache_dir)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/scale_data"))
    parser.add_argument("--kind", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument(
        "--label", help="key of this run's results (default record_table, record_table_parquet)"
    )
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.file, args.cache_dir)))
        return
    path = args.work_dir / f"chats_{args.records}.jsonl"
    if not path.exists():
        write_jsonl(path, args.records)
    if args.kind == "parquet":
        jsonl, path = path, path.with_suffix(".parquet")
        if not path.exists():
            write_parquet(jsonl, path)
    args.label = args.label or ("record_table" + ("" if args.kind == "jsonl" else "_parquet"))
    cache_dir = args.work_dir / f"records_{args.label}"
    if cache_dir.exists():
        import shutil

        shutil.rmtree(cache_dir)
    result = {
        "records": args.records,
        "file_mib": round(path.stat().st_size / 2**20, 1),
        "convert": run_probe(path, cache_dir),
        "cached": run_probe(path, cache_dir),
    }
    out = HERE / "convert_bench.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results.setdefault(args.label, {})[str(args.records)] = result
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
