"""Record tables: every source read through its table equals the in-memory reading record
for record (ids, counts, rejected lines and warnings included), a changed file converts
again, one process converts while the others wait, and the table pickles as a file."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
from pathlib import Path

import pytest

from odb_lightning.data import BadRecordError, ChatDataset, LengthCache, length_fingerprint
from odb_lightning.data.record_table import RecordCache, RecordTableError
from odb_lightning.data.sources import load_source, source_reader
from odb_lightning.data.sources.arrow_records import TableRecords
from odb_lightning.data.sources.chitchat import chitchat_source
from odb_lightning.data.sources.llava import llava_source
from odb_lightning.data.sources.sharegpt import sharegpt_source
from odb_lightning.data.sources.source_records import SourceReader, SourceRecords
from odb_lightning.lit.data.resume_state import data_identity

TURNS = [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def chat(record_id: object = None, turns: list | None = None, **extra: object) -> bytes:
    value = {"messages": TURNS if turns is None else turns, **extra}
    if record_id is not None:
        value["id"] = record_id
    return json.dumps(value).encode()


def mixed_lines(num_records: int = 40) -> list[bytes]:
    """String, integer and missing ids, a repeated id, blank lines, an unsupervised
    record, non-ASCII text and bad lines of several kinds."""
    lines = []
    for k in range(num_records):
        record_id = (f"c{k}", k * 7, None)[k % 3]
        lines.append(chat(record_id, [{"role": "user", "content": f"q{k} é 🙂"}, *TURNS]))
    lines[5] = chat("c0")  # the id of line 1
    lines[8] = chat("lonely", [{"role": "user", "content": "nobody answers"}])
    lines[11] = b""
    lines[13] = b'{"id": 1, "messages": ['
    lines[17] = b'{"messages": [{"role": "robot", "content": ""}]}'
    lines[21] = b'{"id": 1.5, "messages": []}'
    return lines


def same_records(table: SourceRecords, memory: SourceRecords) -> None:
    """The guarantee: record for record, counts, rejected lines and warnings equal."""
    assert isinstance(table.records, TableRecords)
    assert len(table) == len(memory)
    assert list(table.records) == list(memory.records)  # in order, batched
    assert [table.records[i] for i in range(len(table))] == list(memory.records)  # by index
    assert table.counts == memory.counts
    assert table.rejected == memory.rejected
    assert table.warnings == memory.warnings


@pytest.mark.parametrize("max_samples", [None, 15])
def test_jsonl_with_bad_lines_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, max_samples: int | None
) -> None:
    path = write_lines(tmp_path / "chats.jsonl", mixed_lines())
    memory = load_source("jsonl", path=path, max_samples=max_samples, on_bad_record="skip")
    assert memory.counts["dropped/bad_record"] == (3 if max_samples is None else 1)
    assert memory.counts["duplicate_ids"] == 1 and memory.warnings
    cache = RecordCache(tmp_path / "records")
    arguments = {"path": path, "max_samples": max_samples, "on_bad_record": "skip"}
    same_records(load_source("jsonl", **arguments, record_cache=cache), memory)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        hit = load_source("jsonl", **arguments, record_cache=cache)
    same_records(hit, memory)
    settings = {"source": "jsonl"}  # a checkpoint's data identity is the same either way
    assert data_identity(settings, hit.records, len(hit), 3) == data_identity(
        settings, memory.records, len(memory), 3
    )
    assert memory.warnings[0] in caplog.text  # the repeated id is warned about again
    assert "record table hit" in caplog.text and "converting" not in caplog.text


def test_jsonl_bad_line_raises_the_same_error_and_leaves_no_table(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "chats.jsonl", mixed_lines())
    with pytest.raises(BadRecordError) as memory:
        load_source("jsonl", path=path)
    cache = RecordCache(tmp_path / "records")
    with pytest.raises(BadRecordError) as table:
        load_source("jsonl", path=path, record_cache=cache)
    assert str(table.value) == str(memory.value)
    assert "chats.jsonl:14" in str(table.value) and table.value.field == "<line>"
    left = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert len(left) == 1 and left[0].endswith(".lock")  # no entry, no half-written one


def test_llava_records_with_images(tmp_path: Path) -> None:
    lines = [
        chat("a", [{"role": "user", "content": "<image>\nwhat?"}, *TURNS], images=["x.jpg"]),
        json.dumps(
            {"image": "y.png", "conversations": [{"from": "human", "value": "<image>"}]}
        ).encode(),
        chat(3),  # text only
        b'{"images": "x.jpg", "messages": []}',
    ]
    path = write_lines(tmp_path / "llava.jsonl", lines)
    memory = llava_source(path, on_bad_record="skip").collect()
    assert memory.counts["images"] == 2 and memory.counts["text_only"] == 1
    table = RecordCache(tmp_path / "records").records(llava_source(path, on_bad_record="skip"))
    same_records(table, memory)
    assert table.records[1]["images"] == ["y.png"]


@pytest.mark.parametrize(
    "source",
    [
        lambda: sharegpt_source(regime="whole", max_samples=3000),
        lambda: sharegpt_source(regime="first_exchange", max_samples=3000),
        lambda: sharegpt_source(regime="mix", seed=3, max_samples=3000),
        lambda: chitchat_source(),
    ],
    ids=["sharegpt_whole", "sharegpt_first_exchange", "sharegpt_mix", "chitchat"],
)
def test_bundled_sources(tmp_path: Path, source) -> None:
    reader: SourceReader = source()
    memory = reader.collect()
    table = RecordCache(tmp_path).records(source())
    same_records(table, memory)
    dataset = ChatDataset(table.records, _tokenizer(), 64)
    scanned = ChatDataset(memory.records, _tokenizer(), 64)
    indices = list(range(0, len(memory), 2))
    assert dataset.unsupervised_indices(indices) == scanned.unsupervised_indices(indices)


def _tokenizer():
    from odb_lightning.data import QwenTokenizer

    return QwenTokenizer()


def test_a_changed_file_converts_again(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "chats.jsonl", [chat("a"), chat("b")])
    cache = RecordCache(tmp_path / "records")
    first = load_source("jsonl", path=path, record_cache=cache)
    entry = cache.entry_for(source_reader("jsonl", path=path))
    assert entry.is_dir() and [r["id"] for r in first.records] == ["a", "b"]
    write_lines(path, [chat("a"), chat("c")])  # same size, new content
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = load_source("jsonl", path=path, record_cache=cache)
    assert [r["id"] for r in second.records] == ["a", "c"]
    with path.open("ab") as file:  # grown
        file.write(chat("d") + b"\n")
    third = load_source("jsonl", path=path, record_cache=cache)
    assert [r["id"] for r in third.records] == ["a", "c", "d"]
    entries = [p for p in (tmp_path / "records").iterdir() if p.is_dir()]
    assert len(entries) == 3  # one per version of the file
    other = load_source("jsonl", path=path, max_samples=1, record_cache=cache)
    assert len(other) == 1  # the reader's arguments are part of the key


def test_two_processes_converting_at_once_make_one_table(tmp_path: Path) -> None:
    from helpers.record_tables import convert_at_once

    path = write_lines(tmp_path / "chats.jsonl", mixed_lines(400))
    memory = load_source("jsonl", path=path, on_bad_record="skip")
    context = multiprocessing.get_context("spawn")
    barrier, readers, results = context.Barrier(2), context.Value("i", 0), context.Queue()
    cache_dir = tmp_path / "records"
    processes = [
        context.Process(
            target=convert_at_once, args=(str(cache_dir), str(path), barrier, readers, results)
        )
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    got = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert readers.value == 1  # one conversion; the other process read its table
    for records, counts in got:
        assert records == list(memory.records) and counts == dict(memory.counts)
    assert len([p for p in cache_dir.iterdir() if p.is_dir()]) == 1
    assert not list(cache_dir.glob(".*.tmp"))


def test_a_held_lock_fails_naming_the_lock_file(tmp_path: Path) -> None:
    from filelock import FileLock

    path = write_lines(tmp_path / "chats.jsonl", [chat("a")])
    cache = RecordCache(tmp_path / "records", wait_s=0.2)
    reader = source_reader("jsonl", path=path)
    entry = cache.entry_for(reader)
    entry.parent.mkdir(parents=True)
    lock_path = entry.with_name(f"{entry.name}.lock")
    with FileLock(lock_path), pytest.raises(RecordTableError) as info:
        cache.records(reader)
    message = str(info.value)
    assert str(lock_path) in message and "waited 0 s" in message and "delete" in message
    assert len(cache.records(reader)) == 1  # released: converted


def test_a_damaged_table_is_converted_again(tmp_path: Path, caplog) -> None:
    path = write_lines(tmp_path / "chats.jsonl", [chat("a"), chat("b")])
    cache = RecordCache(tmp_path / "records")
    reader = source_reader("jsonl", path=path)
    first = list(cache.records(reader).records)  # read before its file is damaged in place
    (cache.entry_for(reader) / "records.arrow").write_bytes(b"not arrow")
    with caplog.at_level(logging.WARNING):
        again = cache.records(reader)
    assert "is damaged" in caplog.text
    assert list(again.records) == first


def test_a_dataset_over_a_table_pickles_as_a_file_reference(tmp_path: Path) -> None:
    text = " ".join(f"word{k}" for k in range(200))
    lines = [chat(k, [{"role": "user", "content": text}, *TURNS]) for k in range(2000)]
    path = write_lines(tmp_path / "chats.jsonl", lines)
    memory = load_source("jsonl", path=path)
    table = load_source("jsonl", path=path, record_cache=RecordCache(tmp_path / "records"))
    tokenizer = _tokenizer()
    in_memory = len(pickle.dumps(ChatDataset(memory.records, tokenizer, 64)))
    dataset = ChatDataset(table.records, tokenizer, 64)
    mapped = len(pickle.dumps(dataset))
    assert in_memory > 2_000_000 and mapped < in_memory / 50  # the records stay on disk
    assert len(pickle.dumps(table.records)) < 10_000
    copy = pickle.loads(pickle.dumps(dataset))
    assert (
        copy[1234]["input_ids"].tolist()
        == ChatDataset(memory.records, tokenizer, 64)[1234]["input_ids"].tolist()
    )
    view = table.records[100:110]  # a slice is a view of the table, not a list
    assert isinstance(view, TableRecords) and list(view) == memory.records[100:110]


def test_lengths_read_from_the_column_equal_a_fresh_length_pass(tmp_path: Path) -> None:
    lines = [chat(k, [{"role": "user", "content": "word " * k}, *TURNS]) for k in range(60)]
    path = write_lines(tmp_path / "chats.jsonl", lines)
    table = load_source("jsonl", path=path, record_cache=RecordCache(tmp_path / "records"))
    dataset = ChatDataset(table.records, _tokenizer(), 48)
    parts = {"source": "test", **dataset.length_settings()}
    cache = LengthCache(tmp_path / "lengths")
    fingerprint = length_fingerprint(**parts)
    cache.load_or_build(dataset, fingerprint, parts, num_workers=0, progress=False)
    hit = cache.load_or_build(dataset, fingerprint, parts, num_workers=0, progress=False)
    fresh = [dataset[i] for i in range(len(dataset))]
    assert hit.hit and hit.lengths.tolist() == [len(s["input_ids"]) for s in fresh]
    assert hit.num_loss_tokens.tolist() == [int((s["labels"][1:] != -100).sum()) for s in fresh]
    assert 48 in hit.lengths  # truncated samples measured at max_seq_len


def test_ultrachat_supervision_from_its_role_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from odb_lightning.data.sources.ultrachat import ultrachat_records

    roles = [["user", "assistant"], ["user"], ["System", "User", "GPT"], [], ["user", "model"]]
    rows = [
        {"prompt_id": f"p{k}", "messages": [{"role": r, "content": "x"} for r in turns]}
        for k, turns in enumerate(roles * 3)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train_sft-0.parquet")
    records = ultrachat_records(tmp_path, cache_dir=tmp_path / "hf").records
    tokenizer = _tokenizer()
    indices = list(range(len(rows)))
    from_column = ChatDataset(records, tokenizer, 64).unsupervised_indices(indices)
    scanned = ChatDataset(list(records), tokenizer, 64).unsupervised_indices(indices)
    assert from_column == scanned == [1, 3, 6, 8, 11, 13]
