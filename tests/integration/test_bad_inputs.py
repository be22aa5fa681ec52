"""Bad inputs through the path a user takes: a JSON Lines file, ``load_source("jsonl")``,
``ChatDataset``, ``ODBLoader`` (a worker process and the collate process), or a custom
dataset straight into the loader. Each gets an error naming the record (file and line,
or dataset index and record id) and the field, or, under ``on_bad_record="skip"`` /
``on_bad_sample="skip"``, is skipped and counted. docs/reliability.md has the table.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from odb_lightning.core.planners import plan_epoch
from odb_lightning.data import (
    BadRecordError,
    ChatDataset,
    QwenTokenizer,
    load_source,
    ultrachat_records,
)
from odb_lightning.data.length_cache import LengthCache, length_fingerprint
from odb_lightning.runtime import BadSampleError, ODBLoader
from odb_lightning.runtime.stats import EpochStats

ROOT = Path(__file__).resolve().parents[2]
MAX_SEQ_LEN = 1024
MILLION = 1_000_000


def chat(record_id: object, answer: object = "fine, thanks") -> dict:
    messages = [
        {"role": "user", "content": "how are you?"},
        {"role": "assistant", "content": answer},
    ]
    return {"id": record_id, "messages": messages}


def write_jsonl(path: Path, lines: list[bytes | dict]) -> Path:
    raw = [line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines]
    path.write_bytes(b"\n".join(raw) + b"\n")
    return path


def run_loader(dataset: object, **overrides: object) -> tuple[list[list[int]], EpochStats]:
    """One epoch in one worker process: the ids of each step and the epoch's stats."""
    kwargs = {
        "token_budget": 2 * MAX_SEQ_LEN,
        "outstanding_depth": 8,
        "num_workers": 1,
        "multiprocessing_context": "fork",
        "max_seq_len": MAX_SEQ_LEN,
        **overrides,
    }
    with ODBLoader(dataset, **kwargs) as loader:  # type: ignore[arg-type]
        steps = [list(batch.meta.sample_ids) for batch in loader]
    assert loader.last_epoch_stats is not None
    return steps, loader.last_epoch_stats


# -- JSON Lines: rejected when the file is read, before any process starts --------------
JSONL_BAD_LINES = [
    (chat("e", answer="x") | {"messages": []}, "messages", "is empty"),
    ({"id": "m"}, "messages", "missing"),
    (chat("c", answer=42), "messages[1].content", "must be a string, got int"),
    (b'{"id": "u", "messages": []}\xff\xfe', "<line>", "invalid UTF-8 at byte 27"),
    (b'{"id": "j", "messages": [', "<line>", "invalid JSON: Expecting value at character 26"),
]


@pytest.mark.parametrize(("line", "field", "problem"), JSONL_BAD_LINES)
def test_bad_jsonl_line_names_file_line_and_field(
    tmp_path: Path, line: bytes | dict, field: str, problem: str
) -> None:
    path = write_jsonl(tmp_path / "chats.jsonl", [chat("a"), chat("b"), line])
    with pytest.raises(BadRecordError) as info:
        load_source("jsonl", path=path)
    assert info.value.field == field
    assert f"record {path}:3: field {field!r}: {problem}" in str(info.value)


def test_bad_jsonl_lines_skipped_and_counted(tmp_path: Path, tokenizer: QwenTokenizer) -> None:
    good = [chat(f"g{i}") for i in range(6)]
    lines = [good[0], *(line for line, _, _ in JSONL_BAD_LINES), *good[1:]]
    path = write_jsonl(tmp_path / "chats.jsonl", lines)
    source = load_source("jsonl", path=path, on_bad_record="skip")
    assert source.counts["read"] == 11 and source.counts["kept"] == 6
    assert source.counts["dropped/bad_record"] == 5
    assert [re.search(r"chats\.jsonl:(\d+)", m).group(1) for m in source.rejected] == [
        "2", "3", "4", "5", "6",
    ]  # fmt: skip
    steps, stats = run_loader(ChatDataset(source.records, tokenizer, MAX_SEQ_LEN))
    assert sorted(i for step in steps for i in step) == list(range(6))
    assert stats.skipped_ids == ()


def test_duplicated_ids_are_kept_counted_and_logged(
    tmp_path: Path, tokenizer: QwenTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_jsonl(tmp_path / "chats.jsonl", [chat("a"), chat("b"), chat("a"), chat("a")])
    with caplog.at_level(logging.WARNING, logger="odb_lightning.data.sources.jsonl"):
        source = load_source("jsonl", path=path)
    assert source.counts["duplicate_ids"] == 2 and source.counts["kept"] == 4
    assert "id 'a' on line 3 repeats line 1; both are kept" in caplog.text
    steps, _ = run_loader(ChatDataset(source.records, tokenizer, MAX_SEQ_LEN))
    assert sorted(i for step in steps for i in step) == [0, 1, 2, 3]  # by line, once each


def test_million_token_record_is_truncated_to_max_seq_len(
    tmp_path: Path, tokenizer: QwenTokenizer
) -> None:
    huge = "x" + " x" * (MILLION - 1)
    path = write_jsonl(tmp_path / "chats.jsonl", [chat("small"), chat("huge", answer=huge)])
    dataset = ChatDataset(load_source("jsonl", path=path).records, tokenizer, MAX_SEQ_LEN)
    assert len(tokenizer.encode_text(huge)) == MILLION
    with ODBLoader(dataset, token_budget=2 * MAX_SEQ_LEN, outstanding_depth=4, num_workers=1,
                   multiprocessing_context="fork", max_seq_len=MAX_SEQ_LEN) as loader:  # fmt: skip
        rows = {
            sample_id: int(row.sum())
            for batch in loader
            for sample_id, row in zip(
                batch.meta.sample_ids, batch.inputs["attention_mask"], strict=True
            )
        }
    assert rows[1] == MAX_SEQ_LEN and rows[0] < 64
    assert loader.last_epoch_stats.over_budget == 0


# -- Conversations in a custom sequence: rejected when the worker preprocesses them -----
CUSTOM_RECORDS = [
    ({"id": "e", "messages": []}, "messages", r"is empty: a conversation needs a turn"),
    ({"id": "m", "text": "hi"}, "messages", r"is missing"),
    ({"id": "s", "messages": "hi"}, "messages", r"must be a list, got str"),
    (chat("c", answer=["a"]), "messages[1].content", r"must be str, got list"),
    (chat("r") | {"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "unknown"),
]


@pytest.mark.parametrize(("record", "field", "problem"), CUSTOM_RECORDS)
def test_bad_conversation_names_index_record_id_and_field(
    tokenizer: QwenTokenizer, record: dict, field: str, problem: str
) -> None:
    records = [chat(f"g{i}") for i in range(5)]
    records[3] = record
    dataset = ChatDataset(records, tokenizer, MAX_SEQ_LEN)
    with pytest.raises(BadSampleError) as info:
        run_loader(dataset)
    expected = rf"^sample 3: field '{re.escape(field)}' {problem}.*\(record id '{record['id']}'\)"
    assert re.search(expected, str(info.value)), str(info.value)
    assert (info.value.index, info.value.field) == (3, field)
    steps, stats = run_loader(dataset, on_bad_sample="skip")
    assert stats.skipped_ids == (3,)
    assert sorted(i for step in steps for i in step) == [0, 1, 2, 4]


def test_ultrachat_row_without_content_names_index_record_and_field(
    tmp_path: Path, tokenizer: QwenTokenizer
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"prompt_id": f"p{i}", "messages": [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": None if i == 1 else f"answer {i}"},
        ]}
        for i in range(4)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train_sft-0.parquet")
    parquet = tmp_path / "train_sft-0.parquet"
    source = ultrachat_records(parquet, cache_dir=tmp_path / "cache")  # not the user's cache
    dataset = ChatDataset(source.records, tokenizer, MAX_SEQ_LEN)
    with pytest.raises(BadSampleError) as info:
        run_loader(dataset)
    assert str(info.value) == (
        "sample 1: field 'messages[1].content' must be str, got NoneType (record id 'p1') "
        "(on rank 0)"
    )


# -- A custom dataset of token samples ---------------------------------------------------
class OneBadSample:
    """Eight valid samples but for index 3, which is ``bad``."""

    def __init__(self, bad: object) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> object:
        if index == 3:
            return self.bad
        return {"input_ids": torch.arange(1, 10 + index), "labels": torch.arange(1, 10 + index)}


LONG = torch.ones(MILLION, dtype=torch.long)
CUSTOM_SAMPLES = [
    (
        {"labels": torch.ones(4, dtype=torch.long)},
        "input_ids",
        r"is missing \(keys: \['labels'\]\)",
    ),
    (
        {"input_ids": torch.tensor([1.0, float("nan")])},
        "input_ids",
        r"must have an integer dtype, got torch.float32",
    ),
    ({"input_ids": torch.tensor([5, -3, 7])}, "input_ids", r"contains negative token ids"),
    (
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([-100, -1, 7])},
        "labels",
        r"contains negative values other than -100 \(no loss\)",
    ),
    ({"input_ids": LONG}, "input_ids", r"has 1000000 tokens, more than max_seq_len=1024"),
    ({"input_ids": torch.zeros(0, dtype=torch.long)}, "input_ids", r"is empty"),
    (
        torch.ones(4, dtype=torch.long),
        "<sample>",
        r"must be a mapping with 'input_ids', got Tensor",
    ),
]


@pytest.mark.parametrize(("sample", "field", "problem"), CUSTOM_SAMPLES)
def test_bad_custom_sample_names_index_and_field(sample: object, field: str, problem: str) -> None:
    with pytest.raises(
        BadSampleError, match=rf"^sample 3: field '{field}' {problem} \(on rank 0\)"
    ):
        run_loader(OneBadSample(sample))
    steps, stats = run_loader(OneBadSample(sample), on_bad_sample="skip")
    assert stats.skipped_ids == (3,)
    assert sorted(i for step in steps for i in step) == [0, 1, 2, 4, 5, 6, 7]


# -- Lengths handed to the planned modes ---------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), -3, 0, 2.5])
def test_bad_length_names_its_index(bad: float) -> None:
    with pytest.raises(
        ValueError, match=rf"lengths\[1\] must be a positive integer token count, got {bad}"
    ):
        plan_epoch([10, bad, 5], mode="oracle", token_budget=64)  # type: ignore[list-item]


@pytest.mark.parametrize("bad", ["NaN", "-1", "0", "2.5"])
def test_damaged_length_cache_is_rebuilt(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = OneBadSample({"input_ids": torch.arange(1, 5)})
    parts = {"source": "test", "num_records": 8}
    fingerprint = length_fingerprint(**parts)
    cache = LengthCache(tmp_path)
    built = cache.load_or_build(dataset, fingerprint, parts, num_workers=0, progress=False)
    header, body = built.path.read_text().splitlines()
    built.path.write_text(header + "\n" + body.replace("[9,", f"[{bad},", 1) + "\n")
    with caplog.at_level(logging.WARNING, logger="odb_lightning.data.length_cache"):
        again = cache.load_or_build(dataset, fingerprint, parts, num_workers=0, progress=False)
    assert "length cache file is corrupt, rebuilding it" in caplog.text
    assert not again.hit and again.lengths == built.lengths


# -- What a user of train.py sees --------------------------------------------------------
@pytest.mark.slow  # the same jsonl path runs in-process above; this checks what train.py shows
def test_train_py_names_the_bad_line_and_field(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "chats.jsonl", [chat("a"), chat("b"), b'{"id": 3, "messages": [\xff]}']
    )
    command = [
        sys.executable, "train.py", "debug=smoke", "data=jsonl", f"data.path={path}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert f"record {path}:3: field '<line>': invalid UTF-8 at byte 23" in done.stderr
