"""A mixture of sources: each part's records in its share, chosen by the seed, held out
in proportion, named by part; and the data module that reads one from ``data.mixture``."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import QwenTokenizer
from odb_lightning.data.mixture import MixedPart, MixedRecords, chosen_records, part_counts
from odb_lightning.lit.data.datamodule import ODBDataModule


def test_weights_share_what_the_first_part_to_run_out_allows() -> None:
    assert part_counts([3, 1], [None, None], [300, 300]) == [300, 100]
    assert part_counts([3, 1], [None, None], [90, 300]) == [90, 30]
    assert part_counts([None, None], [None, None], [10, 25]) == [10, 10]  # weight 1 each
    assert part_counts([1, 1, 1], [None] * 3, [7, 7, 7]) == [7, 7, 7]


def test_a_sample_count_is_taken_as_it_is_and_a_cap_scales_every_part() -> None:
    assert part_counts([None, 2], [50, None], [10, 40]) == [50, 40]
    assert part_counts([3, 1], [None, None], [300, 300], limit=80) == [60, 20]
    assert part_counts([3, 1], [None, None], [300, 300], limit=0.5) == [150, 50]


def test_chosen_records_repeat_only_past_the_part_and_follow_the_seed() -> None:
    once = chosen_records(10, 6, seed=1, part=0)
    assert len(set(once.tolist())) == 6 and np.all(np.diff(once) > 0)
    assert np.array_equal(once, chosen_records(10, 6, seed=1, part=0))
    assert not np.array_equal(once, chosen_records(10, 6, seed=2, part=0))
    twice = Counter(chosen_records(4, 10, seed=1, part=0).tolist())
    assert sorted(twice.values()) == [2, 2, 3, 3]  # every record twice, two a third time


def records(prefix: str, n: int) -> list[dict]:
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    return [{"id": f"{prefix}{k}", "messages": turns} for k in range(n)]


def test_mixed_records_name_their_part_and_hold_out_in_proportion() -> None:
    a = MixedPart("a.jsonl", records("a", 30), chosen_records(30, 30, 0, 0))
    b = MixedPart("b.json", records("b", 10), chosen_records(10, 10, 0, 1))
    mixed = MixedRecords([a, b])
    assert len(mixed) == 40 and mixed[0]["id"] == "a.jsonl:a0" and mixed[39]["id"] == "b.json:b9"
    assert mixed.part_of([0, 29, 30, 39]).tolist() == [0, 0, 1, 1]
    val, train = mixed.hold_out(8, seed=3)
    assert Counter(mixed.part_of(val).tolist()) == {0: 6, 1: 2}
    assert sorted(val + train) == list(range(40))
    with pytest.raises(ValueError, match="leaves part 'b.json'"):
        MixedRecords(
            [a, MixedPart("b.json", records("b", 1), chosen_records(1, 1, 0, 1))]
        ).hold_out(0.9, seed=0)


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sharegpt(n: int) -> list[dict]:
    conv = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]
    return [{"conversations": conv} for _ in range(n)]


def module(tmp_path: Path, mixture: list[dict], **fields) -> ODBDataModule:
    return ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(num_workers=0), template="chatml",
        record_dir=str(tmp_path / "records"), mixture=mixture, **fields,
    )  # fmt: skip


def test_the_data_module_reads_a_mixture_in_its_shares(tmp_path: Path, caplog) -> None:
    a = write(tmp_path / "a.jsonl", records("a", 90))
    b = write(tmp_path / "b.jsonl", sharegpt(60))
    data = module(
        tmp_path, [{"path": a, "weight": 3}, {"path": b, "weight": 1, "label": "chat"}],
        val_samples=12,
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    mixed = data.mixed_records()
    assert mixed is not None and [len(p.chosen) for p in mixed.parts] == [90, 30]
    parts = Counter(mixed.part_of(data.train_indices).tolist())
    assert parts == {0: 81, 1: 27}  # 3:1 after the hold-out too
    assert "mixture: chat gives 30 of its 60 records (25.0% of 120; weight 1)" in caplog.text
    assert "as ShareGPT" in caplog.text  # each part's layout said as its own
    facts = data.run_report().facts
    assert facts["source"] == "mixture" and facts["mixture"]["a.jsonl"]["records"] == 90
    assert data.data_identity()["mixture"][1]["label"] == "chat"


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        ([{"path": "a.jsonl", "weight": 0}], r"data.mixture\[0\]: weight must be a number > 0"),
        (
            [{"path": "a.jsonl", "weight": 1, "samples": 3}],
            r"data.mixture\[0\]: weight and samples",
        ),
        ([{"path": "a.jsonl", "shares": 1}], r"data.mixture\[0\] has no key shares"),
        ([{"path": "a.jsonl"}, {"path": "x/a.jsonl"}], r"data.mixture\[1\].label='a.jsonl'"),
        ([{"name": "synthetic"}], r"data.mixture\[0\].name=synthetic: a tokens source"),
        ([{"name": "jsonl"}], r"data.mixture\[0\].path is required"),
        ([{"path": "a.jsonl", "format": "chatlog"}], r"data.mixture\[0\].format must be one of"),
    ],
)
def test_a_bad_part_is_named_by_its_key(tmp_path: Path, mixture: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        module(tmp_path, mixture)


def test_a_mixture_is_not_streamed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data.mixture is read through record tables"):
        module(tmp_path, [{"path": "a.jsonl"}], streaming=True, stream_dir="s", val_samples=0)


def test_a_length_pass_mode_caches_a_mixture_under_its_parts(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", records("a", 30))
    b = write(tmp_path / "b.jsonl", sharegpt(20))
    lengths = tmp_path / "lengths"

    def setup(weight: int) -> ODBDataModule:
        data = ODBDataModule.of(
            QwenTokenizer(), BatchingConfig.of(mode="sorted", num_workers=0), template="chatml",
            record_dir=str(tmp_path / "records"), length_dir=str(lengths), val_samples=0,
            mixture=[{"path": a, "weight": weight}, {"path": b}],
        )  # fmt: skip
        data.setup("fit")
        return data

    data = setup(1)
    expected = sorted(len(data.dataset[i]["input_ids"]) for i in range(len(data.dataset)))
    assert sorted(data.train_lengths) == expected and len(expected) == 40
    assert len(list(lengths.glob("*.arrow"))) == 1
    setup(1)  # the same mixture: the same cache
    assert len(list(lengths.glob("*.arrow"))) == 1
    setup(2)  # other shares: another cache
    assert len(list(lengths.glob("*.arrow"))) == 2
