"""Chat sources: recovery of the truncated ShareGPT JSON, role mapping, regimes, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from odb_lightning.data import (
    BadRecordError,
    load_source,
)
from odb_lightning.data.sources.chitchat import chitchat_records
from odb_lightning.data.sources.jsonl import jsonl_records
from odb_lightning.data.sources.sharegpt import ShareGPTRegime, recover_json_array, sharegpt_records
from odb_lightning.data.sources.ultrachat import ultrachat_records

ROLES = {"system", "user", "assistant"}


def test_recover_json_array_stops_at_the_cut() -> None:
    items = [{"id": i, "text": "a, b ] } {"} for i in range(3)]
    text = json.dumps(items, indent=2)
    assert recover_json_array(text) == (items, True)
    for cut in range(len(text) - 1):
        recovered, complete = recover_json_array(text[:cut] if cut > 0 else "[")
        assert not complete
        assert recovered == items[: len(recovered)]
    assert recover_json_array(text[: text.rindex("}") + 1]) == (items, False)
    assert recover_json_array("[]") == ([], True)


@pytest.fixture(scope="module")
def sharegpt_whole():
    return sharegpt_records()


def test_sharegpt_recovers_every_complete_record(sharegpt_whole) -> None:
    counts = sharegpt_whole.counts
    assert counts["read"] == 17_671
    assert counts["dropped/empty"] == 126
    assert counts["kept"] == len(sharegpt_whole) == 17_545
    assert counts["unsupervised"] == 17
    roles = {m["role"] for r in sharegpt_whole.records for m in r["messages"]}
    assert roles == ROLES
    assert sharegpt_whole.records[0]["id"] == "QWJhYvA_0"


def test_sharegpt_regimes(sharegpt_whole) -> None:
    first = sharegpt_records(regime="first_exchange", max_samples=500)
    assert len(first) == 500
    for whole, head in zip(sharegpt_whole.records[:500], first.records, strict=True):
        assert head["messages"] == whole["messages"][:2]
    mix = sharegpt_records(regime=ShareGPTRegime.MIX, seed=3, max_samples=4000)
    again = sharegpt_records(regime="mix", seed=3, max_samples=100)
    assert again.records == mix.records[:100]  # the coin does not depend on max_samples
    shortened = sum(
        len(m["messages"]) < len(w["messages"])
        for m, w in zip(mix.records, sharegpt_whole.records[:4000], strict=True)
    )
    multi_turn = sum(len(w["messages"]) > 2 for w in sharegpt_whole.records[:4000])
    assert 0.45 < shortened / multi_turn < 0.55


def test_chitchat_alternates_speakers() -> None:
    chat = chitchat_records()
    assert chat.counts["read"] == 7_168
    assert chat.counts["dropped/no_assistant"] == 3_150
    assert chat.counts["kept"] == len(chat) == 4_018
    for record in chat.records[:200]:
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2)
    assert len(chitchat_records(max_samples=7)) == 7


def write_ultrachat_parquet(path: Path, num_rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "prompt": f"question {i}",
            "prompt_id": f"p{i}",
            "messages": [
                {"content": f"question {i}", "role": "user"},
                {"content": f"answer {i} " * (i + 1), "role": "assistant"},
            ],
        }
        for i in range(num_rows)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_ultrachat_from_local_parquet(tmp_path: Path) -> None:
    import pickle

    directory = tmp_path / "ultrachat_200k" / "data"
    directory.mkdir(parents=True)
    write_ultrachat_parquet(directory / "train_sft-00000-of-00001.parquet", 12)
    write_ultrachat_parquet(directory / "test_sft-00000-of-00001.parquet", 3)
    cache = tmp_path / "cache"
    source = ultrachat_records(tmp_path / "ultrachat_200k", max_samples=10, cache_dir=cache)
    assert source.counts["read"] == 12 and len(source) == 10  # train_sft files only
    assert source.records[4] == {
        "id": "p4",
        "messages": [
            {"role": "user", "content": "question 4"},
            {"role": "assistant", "content": "answer 4 " * 5},
        ],
    }
    assert [r["id"] for r in source.records[8:]] == ["p8", "p9"]
    assert pickle.loads(pickle.dumps(source.records))[9]["id"] == "p9"
    single = ultrachat_records(directory / "test_sft-00000-of-00001.parquet", cache_dir=cache)
    assert len(single) == 3


def test_ultrachat_without_a_path_names_data_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data.source.path"):
        ultrachat_records(None)
    with pytest.raises(FileNotFoundError, match="data.source.path"):
        ultrachat_records(tmp_path / "nowhere")


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


GOOD = json.dumps(
    {"id": "a", "messages": [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]}
).encode()


def test_jsonl_reads_records(tmp_path: Path) -> None:
    no_id = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
    path = write_lines(tmp_path / "chats.jsonl", [GOOD, b"", no_id, GOOD])
    source = jsonl_records(path)
    assert source.counts["read"] == 3 and len(source) == 3
    assert source.records[0]["messages"][1] == {"role": "assistant", "content": "yo"}
    assert source.records[1]["id"] == 3  # the line number when there is no id
    assert len(load_source("jsonl", path=path, max_samples=2)) == 2


@pytest.mark.parametrize(
    ("bad_line", "field", "problem"),
    [
        (b'{"id": 1, "messages": [', "<line>", "invalid JSON"),
        (b'{"id": 1, "messages": []}\xff', "<line>", "invalid UTF-8"),
        (b"[1, 2]", "<line>", "JSON object"),
        (b'{"id": 1}', "messages", "missing"),
        (b'{"id": 1, "messages": "hi"}', "messages", "list"),
        (b'{"id": 1.5, "messages": []}', "id", "string or integer"),
        (b'{"messages": [{"role": "user", "content": 3}]}', "messages[0].content", "string"),
        (b'{"messages": [{"role": "robot", "content": ""}]}', "messages[0].role", "robot"),
    ],
)
def test_jsonl_errors_name_line_and_field(
    tmp_path: Path, bad_line: bytes, field: str, problem: str
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, GOOD, bad_line])
    with pytest.raises(BadRecordError) as info:
        jsonl_records(path)
    message = str(info.value)
    assert info.value.field == field
    assert "bad.jsonl:3" in message and repr(field) in message and problem in message


def test_unknown_source_and_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope"):
        load_source("nope")
    with pytest.raises(ValueError, match="data.source.path"):
        load_source("jsonl")
    with pytest.raises(FileNotFoundError, match="data.source.path"):
        jsonl_records(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="max_samples"):
        jsonl_records(write_lines(tmp_path / "ok.jsonl", [GOOD]), max_samples=-1)
