"""Which streaming engine feeds ODB: LitData ``StreamingDataset`` or a Hugging Face
``datasets`` iterable dataset, measured on the same local chat records.

For each engine, two reader processes (ranks of a gloo group, as under DDP) read their
part of the same records once. Per rank: the time to the first record, records/s over
the whole part, the PSS of the reader process at the end, and how many records it read;
then whether the engine's own state resumes the part exactly at a mid-part point, and
what each engine does with an uneven number of shards (3 shards over 2 ranks).

    python experiments/streaming/compare_engines.py --records 100000

Writes ``results.json`` beside this file (or ``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
]


def write_jsonl(path: Path, num_records: int, seed: int = 0) -> None:
    """Chat records with a long-tailed length profile (lognormal word counts)."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(num_records):
            words = min(6000, int(rng.lognormvariate(5.5, 0.8)))
            reply = " ".join(rng.choice(WORDS) for _ in range(words))
            messages = [
                {"role": "user", "content": f"question {i}: " + " ".join(WORDS[: 1 + i % 17])},
                {"role": "assistant", "content": reply},
            ]
            out.write(json.dumps({"id": f"r{i}", "messages": messages}) + "\n")


def _records(path: Path):
    with path.open() as lines:
        for index, line in enumerate(lines):
            record = json.loads(line)
            yield {"index": index, "id": record["id"], "messages": json.dumps(record["messages"])}


def _litdata_item(line_and_index):
    index, line = line_and_index
    record = json.loads(line)
    return {"index": index, "id": record["id"], "messages": json.dumps(record["messages"])}


def convert_litdata(jsonl: Path, out_dir: Path, chunk_bytes: str) -> float:
    import litdata

    started = time.perf_counter()
    with jsonl.open() as lines:
        inputs = list(enumerate(lines))
    litdata.optimize(
        fn=_litdata_item, inputs=inputs, output_dir=str(out_dir), chunk_bytes=chunk_bytes,
        num_workers=1, mode="overwrite", start_method="fork",
    )  # fmt: skip
    return time.perf_counter() - started


def convert_arrow(jsonl: Path, out_dir: Path) -> float:
    import datasets

    started = time.perf_counter()
    table = datasets.Dataset.from_generator(
        _records, gen_kwargs={"path": jsonl}, cache_dir=str(out_dir)
    )
    table.save_to_disk(str(out_dir / "table"))
    return time.perf_counter() - started


def _open(engine: str, where: str, rank: int, world_size: int, num_shards: int):
    if engine == "litdata":
        from litdata import StreamingDataset

        return StreamingDataset(where, shuffle=False, drop_last=False)
    import datasets
    from datasets.distributed import split_dataset_by_node

    if engine == "hf_arrow":
        stream = datasets.load_from_disk(where).to_iterable_dataset(num_shards=num_shards)
    else:  # hf_json: the JSON Lines files read as they are
        files = sorted(str(p) for p in Path(where).glob("*.jsonl"))
        stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    return split_dataset_by_node(stream, rank=rank, world_size=world_size)


def _read_part(rank, world_size, port, engine, where, num_shards, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    started = time.perf_counter()
    stream = _open(engine, where, rank, world_size, num_shards)
    first_s, ids = None, []
    for record in stream:
        if first_s is None:
            first_s = time.perf_counter() - started
        ids.append(record["index"] if "index" in record else record["id"])
    total_s = time.perf_counter() - started
    pss = psutil.Process().memory_full_info().pss
    resume = _check_resume(engine, where, rank, world_size, num_shards, ids)
    results[rank] = {
        "records": len(ids), "first_record_s": first_s, "records_per_s": len(ids) / total_s,
        "pss_mib": pss / 2**20, "ids_head": ids[:3], "resume": resume,
        "ids_sha256": hashlib.sha256(repr(ids).encode()).hexdigest()[:16],
    }  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


def _check_resume(engine, where, rank, world_size, num_shards, ids):
    """Read half the part, take the engine's state, resume a fresh reader from it."""
    half = len(ids) // 2
    stream = _open(engine, where, rank, world_size, num_shards)
    iterator = iter(stream)
    for _ in range(half):
        next(iterator)
    if engine == "litdata":
        state = stream.state_dict(num_samples_yielded=half, num_workers=1, batch_size=1)
    else:
        state = stream.state_dict()
    again = _open(engine, where, rank, world_size, num_shards)
    again.load_state_dict(state)
    started = time.perf_counter()
    rest = [r["index"] if "index" in r else r["id"] for r in again]
    return {"exact": rest == ids[half:], "resume_s": time.perf_counter() - started}


def read_with(engine: str, where: str, world_size: int, num_shards: int, port: int) -> list:
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(
        _read_part, args=(world_size, port, engine, where, num_shards, results), nprocs=world_size
    )
    return [dict(results[r]) for r in range(world_size)]


def split_jsonl(jsonl: Path, out_dir: Path, parts: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = jsonl.read_text().splitlines(keepends=True)
    size = -(-len(lines) // parts)
    for k in range(parts):
        (out_dir / f"part{k}.jsonl").write_text("".join(lines[k * size : (k + 1) * size]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="odb-stream-"))
    try:
        jsonl = work / "chats.jsonl"
        write_jsonl(jsonl, args.records)
        size_mib = jsonl.stat().st_size / 2**20
        report = {"records": args.records, "jsonl_mib": size_mib, "engines": {}}
        lit_dir, arrow_dir = work / "litdata", work / "arrow"
        conversions = {
            "litdata": convert_litdata(jsonl, lit_dir, "64MB"),
            "hf_arrow": convert_arrow(jsonl, arrow_dir),
            "hf_json": 0.0,
        }
        split_jsonl(jsonl, work / "json4", 4)
        places = {
            "litdata": str(lit_dir),
            "hf_arrow": str(arrow_dir / "table"),
            "hf_json": str(work / "json4"),
        }
        for port, engine in enumerate(places, start=29611):
            ranks = read_with(engine, places[engine], 2, 4, port)
            report["engines"][engine] = {"conversion_s": conversions[engine], "ranks": ranks}
        # Uneven shards: 3 LitData chunks / 3 HF shards over 2 ranks.
        uneven = {}
        small = work / "small.jsonl"
        write_jsonl(small, 3000, seed=1)
        lit_small = work / "litdata_small"
        convert_litdata(small, lit_small, "1MB")
        chunks = len(json.loads((lit_small / "index.json").read_text())["chunks"])
        ranks = read_with("litdata", str(lit_small), 2, 3, 29621)
        uneven["litdata"] = {"chunks": chunks, "records_per_rank": [r["records"] for r in ranks]}
        arrow_small = work / "arrow_small"
        convert_arrow(small, arrow_small)
        ranks = read_with("hf_arrow", str(arrow_small / "table"), 2, 3, 29622)
        uneven["hf_arrow"] = {"shards": 3, "records_per_rank": [r["records"] for r in ranks]}
        split_jsonl(small, work / "json3", 3)
        ranks = read_with("hf_json", str(work / "json3"), 2, 3, 29623)
        uneven["hf_json"] = {"shards": 3, "records_per_rank": [r["records"] for r in ranks]}
        report["uneven_shards"] = uneven
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
