"""Chat records written as a stream (LitData chunks): the same records, ids and bad-line
counts as the in-memory ``jsonl`` source; a changed file gets another stream; two
processes converting at once produce one."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from odb_lightning.data import BadRecordError
from odb_lightning.data.sources.jsonl import jsonl_records
from odb_lightning.data.stream import ChatStream, StreamedChatDataset
from odb_lightning.data.stream_convert import (
    convert_jsonl_stream,
    stream_fingerprint,
    write_chat_stream,
)

LINES = [
    {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "gpt", "content": "yo"}]},
    {"messages": [{"role": "human", "content": "no id"}, {"role": "assistant", "content": "ok"}]},
    "not json",
    {
        "id": "a",
        "messages": [{"role": "user", "content": "dup"}, {"role": "assistant", "content": "é"}],
    },
    {"id": 7, "messages": []},
    {
        "id": "z",
        "messages": [{"role": "user", "content": "last"}, {"role": "assistant", "content": "!"}],
    },
]


def _write(path: Path) -> Path:
    rows = [line if isinstance(line, str) else json.dumps(line) for line in LINES]
    path.write_text("\n".join(rows[:2]) + "\n\n" + "\n".join(rows[2:]) + "\n")
    return path


def test_stream_equals_the_jsonl_source_record_for_record(tmp_path: Path) -> None:
    jsonl = _write(tmp_path / "chats.jsonl")
    counts = write_chat_stream(jsonl, tmp_path / "chunks", "skip")
    stream = ChatStream(tmp_path / "chunks")
    part = stream.part(1, 0)
    streamed = [record for _, record in stream.records(part, 0)]
    source = jsonl_records(jsonl, on_bad_record="skip")
    expected = [{"id": str(r["id"]), "messages": r["messages"]} for r in source.records]
    assert streamed == expected
    assert [i for i, _ in stream.records(part, 0)] == list(range(len(expected)))
    assert counts == dict(source.counts) == stream.counts
    assert counts["dropped/bad_record"] == 2 and counts["duplicate_ids"] == 1


def test_a_bad_line_raises_naming_file_line_and_field(tmp_path: Path) -> None:
    jsonl = _write(tmp_path / "chats.jsonl")
    with pytest.raises(BadRecordError, match=rf"{jsonl}:4: field '<line>'"):
        write_chat_stream(jsonl, tmp_path / "chunks", "raise")


def test_streamed_dataset_tokenizes_records_as_chat_dataset_does(tmp_path: Path, tokenizer) -> None:
    from odb_lightning.data import ChatDataset

    records = [
        {"id": "a", "messages": LINES[0]["messages"][:1] + [{"role": "assistant", "content": "yo"}]}
    ]
    mapped = ChatDataset(records, tokenizer, 64, template="chatml")
    streamed = StreamedChatDataset(1, tokenizer, 64, template="chatml")
    sample, expected = streamed.tokenize_record(records[0], 0), mapped[0]
    assert sample["input_ids"].tolist() == expected["input_ids"].tolist()
    assert sample["labels"].tolist() == expected["labels"].tolist()
    with pytest.raises(TypeError, match="no random access"):
        streamed[0]


def test_a_changed_file_gets_another_fingerprint(tmp_path: Path) -> None:
    jsonl = _write(tmp_path / "chats.jsonl")
    before = stream_fingerprint(jsonl, "skip")
    assert stream_fingerprint(jsonl, "raise") != before
    stat = jsonl.stat()
    os.utime(jsonl, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert stream_fingerprint(jsonl, "skip") != before


def _convert(jsonl: str, cache_dir: str, results) -> None:
    results.put(str(convert_jsonl_stream(jsonl, cache_dir, "skip")))


@pytest.mark.slow
def test_two_processes_converting_at_once_produce_one_stream(tmp_path: Path) -> None:
    jsonl = _write(tmp_path / "chats.jsonl")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=_convert, args=(str(jsonl), str(tmp_path / "cache"), results))
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    directories = {results.get(timeout=300) for _ in processes}
    for process in processes:
        process.join(60)
    assert len(directories) == 1
    (directory,) = directories
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == [
        Path(directory).name
    ]
    assert ChatStream(directory).num_records == 4
