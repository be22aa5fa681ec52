"""Length pass over a source: drop vs truncate, counts, and summary statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from odb_lightning.data import (
    LengthStats,
    QwenTokenizer,
    build_chat_template,
    load_source,
    measure_source,
    source_lengths,
)


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    lines = [
        {
            "id": i,
            "messages": [
                {"role": "user", "content": "word " * (10 * i)},
                {"role": "assistant", "content": "ok"},
            ],
        }
        for i in range(1, 11)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_lengths_match_the_template(chats: Path, tokenizer: QwenTokenizer) -> None:
    template = build_chat_template(tokenizer, "chatml")
    records = load_source("jsonl", path=chats).records
    expected = [template.tokenize(r["messages"]).length for r in records]
    assert source_lengths("jsonl", path=chats, max_seq_len=10_000) == expected


def test_drop_and_truncate(chats: Path) -> None:
    full = source_lengths("jsonl", path=chats, max_seq_len=10_000)
    limit = sorted(full)[6]
    dropped = measure_source("jsonl", path=chats, max_seq_len=limit, progress=False)
    assert dropped.lengths == [n for n in full if n <= limit]
    assert dropped.counts["dropped/over_max_seq_len"] == 3
    assert dropped.counts["kept"] == 10 and dropped.num_tokenized == 10
    assert dropped.samples_per_s > 0
    cut = measure_source("jsonl", path=chats, max_seq_len=limit, over_length="truncate")
    assert cut.lengths == [min(n, limit) for n in full] and cut.counts["truncated"] == 3
    assert source_lengths("jsonl", path=chats, max_samples=4) == full[:4]


def test_synthetic_lengths_follow_the_profile() -> None:
    report = measure_source("synthetic", regime="first_exchange", max_samples=20_000)
    assert report.stats.count == 20_000
    assert report.stats.mean == pytest.approx(501, rel=0.03)
    assert report.stats.cv == pytest.approx(0.92, rel=0.06)


def test_length_stats() -> None:
    stats = LengthStats.of([1, 2, 3, 4, 10])
    assert (stats.count, stats.mean, stats.minimum, stats.p50, stats.maximum) == (5, 4, 1, 3, 10)
    assert stats.cv == pytest.approx(3.1623 / 4, rel=1e-3)
    with pytest.raises(ValueError):
        LengthStats.of([])
