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

import numpy as np
import pyarrow as pa
import pytest
import torch

from odb_lightning.core.planners import plan_epoch
from odb_lightning.data import (
    BadRecordError,
    ChatDataset,
    QwenTokenizer,
    load_source,
)
from odb_lightning.data.length_cache import LengthCache, length_fingerprint
from odb_lightning.data.sources.ultrachat import ultrachat_records
from odb_lightning.runtime import BadSampleError, ODBLoader
from odb_lightning.runtime.planned import PlannedLoader
from odb_lightning.runtime.stats import EpochStats
from testing.harness.datasets import SyntheticChatDataset
from testing.harness.ranks import RankJob, run_ranks

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


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            b'{"id": "s", "messages": "abc',
            "invalid JSON: Invalid control character at character 28",
        ),
        (
            b'{"id": "t", "messages": "a\tb"}',
            "invalid JSON: Invalid control character at character 26",
        ),
    ],
)
def test_json_errors_say_at_once_and_the_skip_key(
    tmp_path: Path, line: bytes, problem: str
) -> None:
    path = write_jsonl(tmp_path / "chats.jsonl", [chat("a"), line])
    with pytest.raises(BadRecordError) as info:
        load_source("jsonl", path=path)
    message = str(info.value)
    assert f"record {path}:2: field '<line>': {problem} (" in message
    assert "at at" not in message
    assert "batching.loader.on_bad_sample=skip" in message


def test_skipped_lines_are_named_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = [chat("a"), *(b'{"id": %d' % i for i in range(7)), chat("b")]
    path = write_jsonl(tmp_path / "chats.jsonl", lines)
    with caplog.at_level("WARNING"):
        source = load_source("jsonl", path=path, on_bad_record="skip")
    named = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped ")]
    assert named == [f"skipped {m}" for m in source.rejected[:5]]
    assert [f"{path}:{n}" in m for n, m in zip(range(2, 7), named, strict=True)] == [True] * 5
    assert source.counts["dropped/bad_record"] == len(source.rejected) == 7


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
    records = load_source("jsonl", path=path).records
    dataset = ChatDataset(records, tokenizer, MAX_SEQ_LEN, truncation="tail")
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
    ({"input_ids": torch.tensor([5, -3, 7])}, "input_ids", r"contains negative token id -3"),
    (
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([-100, -1, 7])},
        "labels",
        r"contains negative value -1, other than -100 \(no loss\)",
    ),
    (
        {"input_ids": np.array([1.0, 2.0, 3.0])},
        "input_ids",
        r"must have an integer dtype, got float64",
    ),
    (
        {"input_ids": torch.tensor([5, 6]), "labels": np.array([True, False])},
        "labels",
        r"must have an integer dtype, got bool",
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


# -- Token ids: any integer dtype is widened to int64; ids out of the vocabulary are bad --
class TokenSamples:
    """Sample ``i``: ``input_ids`` ``ids(i)`` of dtype ``dtypes[i % len(dtypes)]``, a torch
    tensor or (``as_numpy``) a NumPy array, as a slice of a pre-tokenized memmap is."""

    def __init__(self, dtypes: list[torch.dtype], as_numpy: bool = False) -> None:
        self.dtypes, self.as_numpy = dtypes, as_numpy

    def __len__(self) -> int:
        return 8

    def ids(self, index: int) -> list[int]:
        dtype = self.dtypes[index % len(self.dtypes)]
        top = 250 if dtype == torch.uint8 else 65000
        length = 4 if dtype == torch.uint8 else 2 + index % 2  # uint8 first in its batch
        return [top - index, 1 + index, top - 7 * index, 200 + index][:length]

    def __getitem__(self, index: int) -> dict:
        dtype = self.dtypes[index % len(self.dtypes)]
        ids = torch.tensor(self.ids(index)).to(dtype)
        return {"input_ids": ids.numpy() if self.as_numpy else ids}


def rows_by_id(loader: ODBLoader) -> dict[int, list[int]]:
    """Every sample's row of ``input_ids`` (padding cut off), checking the batch dtypes."""
    rows = {}
    with loader:
        for batch in loader:
            inputs = batch.inputs
            assert inputs["input_ids"].dtype == inputs["labels"].dtype == torch.int64
            for sample_id, ids, labels, mask in zip(
                batch.meta.sample_ids,
                inputs["input_ids"],
                inputs["labels"],
                inputs["attention_mask"].bool(),
                strict=True,
            ):
                assert torch.equal(ids[mask], labels[mask])
                rows[sample_id] = ids[mask].tolist()
    return rows


@pytest.mark.parametrize(
    ("dtypes", "as_numpy"),
    [([torch.uint16], False), ([torch.uint16], True), ([torch.uint8, torch.int64], False)],
    ids=["uint16", "numpy-uint16", "uint8+int64"],
)
def test_integer_token_ids_keep_their_values(dtypes: list[torch.dtype], as_numpy: bool) -> None:
    dataset = TokenSamples(dtypes, as_numpy)
    loader = ODBLoader(dataset, token_budget=64, num_workers=1, multiprocessing_context="fork")
    assert rows_by_id(loader) == {i: dataset.ids(i) for i in range(len(dataset))}


OUT_OF_VOCAB = [
    ({"input_ids": torch.tensor([5, 1000, 7])}, "input_ids", 1000),
    ({"input_ids": torch.tensor([5, 7]), "labels": torch.tensor([-100, 4242])}, "labels", 4242),
]


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize(("sample", "field", "value"), OUT_OF_VOCAB)
def test_token_id_beyond_the_vocabulary_names_sample_field_value_and_vocab(
    sample: dict, field: str, value: int, num_workers: int
) -> None:
    dataset = OneBadSample(sample)
    expected = (
        f"sample 3: field '{field}' contains token id {value}, not below the model's "
        "vocab_size=1000 (on rank 0)"
    )
    with pytest.raises(BadSampleError) as info:
        run_loader(dataset, vocab_size=1000, num_workers=num_workers)
    assert str(info.value) == expected
    steps, stats = run_loader(dataset, vocab_size=1000, num_workers=num_workers,
                              on_bad_sample="skip")  # fmt: skip
    assert stats.skipped_ids == (3,)
    assert sorted(i for step in steps for i in step) == [0, 1, 2, 4, 5, 6, 7]


def test_planned_loader_checks_token_ids_against_the_vocabulary() -> None:
    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    planned = {"mode": "standard", "batch_size": 2, "num_workers": 0}
    loader = PlannedLoader(OneBadSample(OUT_OF_VOCAB[0][0]), lambda e: batches, vocab_size=1000,
                           **planned)  # fmt: skip
    with pytest.raises(BadSampleError) as info:
        list(loader)
    assert str(info.value) == (
        "sample 3: field 'input_ids' contains token id 1000, not below the model's vocab_size=1000"
    )
    fine_ids = TokenSamples([torch.uint16]).ids
    fine = PlannedLoader(TokenSamples([torch.uint16]), lambda e: batches, vocab_size=65536,
                         **planned)  # fmt: skip
    batch = next(iter(fine))
    assert batch.inputs["input_ids"].dtype == torch.int64
    rows = batch.inputs["input_ids"][batch.inputs["attention_mask"].bool()].tolist()
    assert rows == [t for i in batch.meta.sample_ids for t in fine_ids(i)]


def test_out_of_vocabulary_ids_on_both_ranks_fail_both_or_are_skipped_on_both() -> None:
    """Ids up to 999, vocabulary 995: 27 of the 64 samples are bad, on both ranks."""
    dataset = SyntheticChatDataset.seeded(64)
    bad = {i for i in range(len(dataset)) if int(dataset[i]["input_ids"].max()) >= 995}
    loader = {"token_budget": 600, "outstanding_depth": 16, "num_workers": 1,
              "multiprocessing_context": "fork", "vocab_size": 995}  # fmt: skip
    failed = run_ranks(RankJob(dataset, loader), world_size=2)
    assert failed.ok == {} and sorted(failed.errors) == [0, 1]  # no rank finishes alone
    messages = [message for name, message, _ in failed.errors.values()]
    assert any(
        re.search(r"^sample \d+: field 'input_ids' contains token id 99[5-9], not below "
                  r"the model's vocab_size=995 \(on rank [01]\)", message)
        for message in messages
    ), messages  # fmt: skip
    skipped = run_ranks(RankJob(dataset, loader | {"on_bad_sample": "skip"}), world_size=2)
    assert skipped.errors == {}
    epochs = [skipped.ok[rank][0] for rank in range(2)]
    assert all(epoch["stats"].skipped_ids for epoch in epochs)  # bad samples on both ranks
    assert sorted(i for epoch in epochs for i in epoch["stats"].skipped_ids) == sorted(bad)
    emitted = [i for e in epochs for step in e["steps"] for i in step["meta"].sample_ids]
    assert sorted(emitted) == sorted(set(range(len(dataset))) - bad)


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
    table = pa.ipc.open_file(pa.memory_map(str(built.path))).read_all()
    lengths = [float(bad), *table.column("length").to_pylist()[1:]]
    column = pa.array(lengths, pa.float64() if bad in ("NaN", "2.5") else pa.int32())
    table = table.set_column(0, pa.field("length", column.type), column)
    with pa.OSFile(str(built.path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with caplog.at_level(logging.WARNING, logger="odb_lightning.data.length_cache"):
        again = cache.load_or_build(dataset, fingerprint, parts, num_workers=0, progress=False)
    assert "length cache file is corrupt, rebuilding it" in caplog.text
    assert not again.hit and again.lengths.tolist() == built.lengths.tolist()


# -- What a user of train.py sees --------------------------------------------------------
@pytest.mark.slow  # the same jsonl path runs in-process above; this checks what train.py shows
def test_train_py_names_the_bad_line_and_field(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "chats.jsonl", [chat("a"), chat("b"), b'{"id": 3, "messages": [\xff]}']
    )
    command = [
        sys.executable, "train.py", "debug=smoke", "data=jsonl", f"data.source.path={path}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert f"record {path}:3: field '<line>': invalid UTF-8 at byte 23" in done.stderr
