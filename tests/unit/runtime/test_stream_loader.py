"""Streaming (``ODBLoader(stream=...)`` over LitData chunks): each rank reads its own part
in order; every record once per epoch, equal step counts with parts of unequal size, and
a stop mid-epoch resumed exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.streams import (
    ReplyLengthDataset,
    StreamJob,
    run_stream_ranks,
    seeded_lengths,
    write_records,
)
from odb_lightning.data.stream import ChatStream, StreamPart
from odb_lightning.data.stream_convert import write_chat_stream
from odb_lightning.runtime import ODBLoader

NUM_RECORDS = 301  # odd: the two ranks' parts differ by a record
LOADER = {
    "token_budget": 1024,
    "shard_dealing": "fixed",
    "num_workers": 1,
    "window_budgets": 4,
    "multiprocessing_context": "fork",  # the ranks are forked from a preloaded server
}


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """301 records in LitData chunks of 8 KB: an odd number of chunks over two ranks."""
    root = tmp_path_factory.mktemp("stream")
    jsonl = write_records(root / "chats.jsonl", seeded_lengths(NUM_RECORDS))
    out = root / "chunks"
    write_chat_stream(jsonl, out, "raise", chunk_bytes="8KB")
    return out


def _ids(steps: list[list[int]]) -> list[int]:
    return [i for step in steps for i in step]


def test_stream_chunks_are_uneven(stream_dir: Path) -> None:
    chunks = json.loads((stream_dir / "index.json").read_text())["chunks"]
    assert len(chunks) % 2 == 1 and len(chunks) > 2


def test_two_ranks_read_every_record_once_with_equal_steps(stream_dir: Path) -> None:
    ranks = run_stream_ranks(StreamJob(str(stream_dir), LOADER, epochs=2))
    parts = [ranks[r]["part"] for r in range(2)]
    assert [count for _, count in parts] == [150, 151]  # unequal parts
    for epoch in range(2):
        steps = [ranks[r]["epochs"][epoch] for r in range(2)]
        assert len(steps[0]) == len(steps[1])  # join: the shorter part idles
        ids = [_ids(s) for s in steps]
        assert sorted(ids[0] + ids[1]) == list(range(NUM_RECORDS))
        for (first, count), rank_ids in zip(parts, ids, strict=True):
            assert set(rank_ids) == set(range(first, first + count))  # its own part


def test_two_ranks_stop_mid_epoch_and_resume_exactly(stream_dir: Path) -> None:
    ranks = run_stream_ranks(StreamJob(str(stream_dir), LOADER, stop_after=3))
    before = [_ids(ranks[r]["before"]) for r in range(2)]
    after = [_ids(ranks[r]["after"]) for r in range(2)]
    assert len(ranks[0]["after"]) == len(ranks[1]["after"])
    assert ranks[0]["state"]["consumed_ids"] == sorted(before[0] + before[1])
    emitted = before[0] + before[1] + after[0] + after[1]
    assert sorted(emitted) == list(range(NUM_RECORDS))  # no duplicate, none skipped


def test_non_join_counts_what_it_drops(stream_dir: Path) -> None:
    ranks = run_stream_ranks(StreamJob(str(stream_dir), LOADER | {"join": False}))
    steps = [ranks[r]["epochs"][0] for r in range(2)]
    assert len(steps[0]) == len(steps[1])
    ids = _ids(steps[0]) + _ids(steps[1])
    assert len(ids) == len(set(ids)) and len(ids) <= NUM_RECORDS


def test_one_rank_in_process_reads_the_whole_stream(stream_dir: Path) -> None:
    stream = ChatStream(stream_dir)
    dataset = ReplyLengthDataset(stream.num_records)
    lengths: dict[int, int] = {}
    with ODBLoader(dataset, stream=stream, **LOADER | {"num_workers": 0}) as loader:
        for batch in loader:
            meta = batch.meta
            lengths |= dict(zip(meta.sample_ids, meta.sample_lengths, strict=True))
    assert sorted(lengths) == list(range(NUM_RECORDS))
    assert [lengths[i] for i in range(NUM_RECORDS)] == seeded_lengths(NUM_RECORDS)


def test_records_restart_at_an_offset_without_reading_before_it(stream_dir: Path) -> None:
    stream = ChatStream(stream_dir)
    part = stream.part(1, 0)
    assert part == StreamPart(0, NUM_RECORDS)
    rest = list(stream.records(part, 200))
    assert [i for i, _ in rest] == list(range(200, NUM_RECORDS))
    assert rest[0][1]["id"] == "rec200"


def test_by_need_dealing_is_refused_with_the_fix(stream_dir: Path) -> None:
    stream = ChatStream(stream_dir)
    with pytest.raises(ValueError, match="shard_dealing=fixed"):
        ODBLoader(ReplyLengthDataset(stream.num_records), stream=stream, token_budget=1024)
