"""A record table proves its content: a damaged or planted entry is converted again or
refused naming it, a stale one is never read, and a row that cannot be decoded is a bad
sample naming its index and table (data/record_table.py, data/sources/arrow_records.py)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from odb_lightning.data.record_table import (
    RECORDS_FILE,
    SOURCE_FILE,
    RecordCache,
    RecordTableError,
)
from odb_lightning.data.sources import load_source, source_reader
from odb_lightning.runtime.worker import record_label
from odb_lightning.sample import BadSampleError

TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def _file(path: Path, ids: list[str]) -> Path:
    lines = [json.dumps({"id": i, "messages": TURNS}) for i in ids]
    path.write_text("\n".join(lines) + "\n")
    return path


def _flip_in_place(path: Path, needle: bytes, replacement: bytes) -> None:
    """Same size, same modification time: what a bad sector or a careless edit leaves."""
    assert len(needle) == len(replacement)
    stat = path.stat()
    data = path.read_bytes()
    assert data.count(needle) == 1
    path.write_bytes(data.replace(needle, replacement))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_same_size_flip_in_the_table_is_found_and_converted_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _file(tmp_path / "chats.jsonl", ["alpha", "bravo"])
    cache = RecordCache(tmp_path / "records")
    reader = source_reader("jsonl", path=path)
    first = [dict(r) for r in cache.records(reader).records]
    table = cache.entry_for(reader) / RECORDS_FILE
    _flip_in_place(table, b"bravo", b"brava")  # still valid UTF-8: would train silently
    with caplog.at_level(logging.WARNING):
        again = cache.records(reader)
    assert f"record table {cache.entry_for(reader)} is damaged (records.arrow: page 0 of 1" in (
        caplog.text
    )
    assert [dict(r) for r in again.records] == first


def test_an_entry_planted_as_a_link_is_refused_naming_it(tmp_path: Path) -> None:
    path = _file(tmp_path / "chats.jsonl", ["alpha"])
    planted_from = _file(tmp_path / "other.jsonl", ["planted"])
    cache = RecordCache(tmp_path / "records")
    reader = source_reader("jsonl", path=path)
    entry = cache.entry_for(reader)
    # A table of other records, with source.json carrying the victim's fingerprint.
    other = RecordCache(tmp_path / "elsewhere")
    other_entry = other.entry_for(source_reader("jsonl", path=planted_from))
    other.records(source_reader("jsonl", path=planted_from))
    meta = json.loads((other_entry / SOURCE_FILE).read_text())
    victim = json.loads(json.dumps(meta))
    from odb_lightning.data.record_table import table_fingerprint, table_parts

    victim["fingerprint"] = table_fingerprint(table_parts(reader))
    (other_entry / SOURCE_FILE).write_text(json.dumps(victim))
    entry.parent.mkdir(parents=True)
    entry.symlink_to(other_entry)
    with pytest.raises(RecordTableError) as refused:
        cache.records(reader)
    assert str(refused.value) == (
        f"the record table entry {entry} is not the cache's own: {entry} is a symbolic link "
        f"(to {other_entry}), and the cache writes real files only. Remove it (rm {entry}) "
        "and the next run converts the source again"
    )
    entry.unlink()
    assert [r["id"] for r in cache.records(reader).records] == ["alpha"]


def test_an_edit_that_restores_the_modification_time_is_a_new_table(tmp_path: Path) -> None:
    path = _file(tmp_path / "chats.jsonl", ["alpha", "bravo"])
    cache = RecordCache(tmp_path / "records")
    assert [r["id"] for r in load_source("jsonl", path=path, record_cache=cache).records] == [
        "alpha", "bravo",
    ]  # fmt: skip
    before = path.stat()
    edited = _file(tmp_path / "edited.jsonl", ["alpha", "brava"])
    os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns))
    shutil.copy2(edited, path)  # cp -p: same size and modification time as before
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (
        before.st_size, before.st_mtime_ns,
    )  # fmt: skip
    again = load_source("jsonl", path=path, record_cache=cache)
    assert [r["id"] for r in again.records] == ["alpha", "brava"]


def test_an_undecodable_row_is_a_bad_sample_naming_its_index_and_table(tmp_path: Path) -> None:
    # A table over the small-table bound, so the check samples pages; the damage then
    # sits in a row the check did not read. Here: the whole-file check is bypassed by
    # damaging the table after it was opened (its pages are read on access).
    path = _file(tmp_path / "chats.jsonl", ["alpha", "bravo", "charlie"])
    cache = RecordCache(tmp_path / "records")
    reader = source_reader("jsonl", path=path)
    records = cache.records(reader).records
    table = cache.entry_for(reader) / RECORDS_FILE
    data = bytearray(table.read_bytes())
    at = bytes(data).index(b"bravo")
    data[at : at + 2] = b"\xff\xfe"  # invalid UTF-8, same size
    with table.open("r+b") as file:  # in place: the open memory map sees it
        file.write(bytes(data))
    with pytest.raises(BadSampleError) as bad:
        records[1]
    message = str(bad.value)
    assert bad.value.index == 1 and bad.value.field == "record"
    assert f"row 1 of {table} raised UnicodeDecodeError" in message
    assert f"delete {cache.entry_for(reader)} and the next run converts" in message

    class Dataset:  # the label of an error must not raise again
        def record_id(self, index: int) -> object:
            return records[index]["id"]

    assert record_label(Dataset(), 1) == ""
    assert record_label(Dataset(), 0) == " (record id 'alpha')"
