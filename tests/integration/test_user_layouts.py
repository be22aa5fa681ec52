"""Each shape a user keeps conversations in trains through ``train.py`` as it is: ShareGPT
(JSON Lines and a JSON array), Alpaca, plain text, a parquet file and a ``save_to_disk``
folder, every training record once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.train_run import read_audit_ids, train

NUM = 40


def chats() -> list[list[tuple[str, str]]]:
    return [[(f"question {k}?", f"answer {k}.")] * (1 + k % 2) for k in range(NUM)]


def sharegpt(k: int, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    turns = [
        t for q, a in pairs for t in ({"from": "human", "value": q}, {"from": "gpt", "value": a})
    ]
    return {"id": f"c{k}", "conversations": turns}


def alpaca(k: int, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    *history, (query, answer) = pairs
    record = {"id": f"c{k}", "instruction": query, "input": "", "output": answer}
    return record | {"history": [list(p) for p in history]}


def messages(k: int, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    turns = [
        t
        for q, a in pairs
        for t in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
    ]
    return {"id": f"c{k}", "messages": turns}


def text(k: int, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    return {"id": f"c{k}", "text": " ".join(q + " " + a for q, a in pairs)}


def write(kind: str, directory: Path) -> Path:
    layouts = {"sharegpt_jsonl": sharegpt, "sharegpt_array": sharegpt, "alpaca": alpaca}
    layout = (layouts | {"text": text}).get(kind, messages)
    records = [layout(k, pairs) for k, pairs in enumerate(chats())]
    if kind == "sharegpt_array":
        path = directory / "chats.json"
        path.write_text(json.dumps(records, indent=1))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = directory / "chats.parquet"
        pq.write_table(pa.Table.from_pylist(records), path)
    elif kind == "save_to_disk":
        import datasets

        path = directory / "saved"
        datasets.Dataset.from_list(records).save_to_disk(str(path))
    else:
        path = directory / "chats.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "sharegpt_array",
        pytest.param("sharegpt_jsonl", marks=pytest.mark.slow),
        pytest.param("alpaca", marks=pytest.mark.slow),
        pytest.param("parquet", marks=pytest.mark.slow),
        pytest.param("save_to_disk", marks=pytest.mark.slow),
        pytest.param("text", marks=pytest.mark.slow),
    ],
)
def test_a_users_layout_trains_every_record_once(kind: str, tmp_path: Path) -> None:
    path = write(kind, tmp_path)
    run = tmp_path / "run"
    summary = train(run, "data=jsonl", f"data.source.path={path}", "audit_ids=true")
    # debug=smoke holds out 0.2 of the 40 records for validation.
    assert summary["train_samples"] == 32 == summary["emitted_samples"]
    assert summary["source_records"]["read"] == NUM
    (steps,) = read_audit_ids(run, 1)
    emitted = [i for step in steps for i in step]
    assert len(emitted) == len(set(emitted)) == 32
    assert set(emitted) <= {f"c{k}" for k in range(NUM)}
