"""The user's conversations in every layout and file kind give the same samples as the
``messages`` JSON Lines form: token ids and supervised labels equal, record by record."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import BadRecordError, ChatDataset, QwenTokenizer
from odb_lightning.data.sources.files import DataPathError
from odb_lightning.data.sources.jsonl import jsonl_records
from odb_lightning.lit.data.datamodule import ODBDataModule

NUM = 50
FROM = "conversations[0].from"


def conversations() -> list[list[dict[str, str]]]:
    """50 varied conversations: with and without a system turn, one to three exchanges,
    unicode, leading newlines, code."""
    chats = []
    for k in range(NUM):
        turns = [{"role": "system", "content": f"be brief {k}"}] if k % 3 == 0 else []
        for e in range(1 + k % 3):
            turns.append({"role": "user", "content": f"question {k}.{e} — ünïcode ✓"})
            answer = f"\nanswer {k}.{e}" if k % 5 == 0 else f"`code({k}, {e})`"
            turns.append({"role": "assistant", "content": answer})
        chats.append(turns)
    return chats


def as_messages(turns: list[dict[str, str]]) -> dict[str, Any]:
    return {"messages": turns}


def as_sharegpt(turns: list[dict[str, str]]) -> dict[str, Any]:
    names = {"user": "human", "assistant": "gpt"}
    record: dict[str, Any] = {}
    if turns[0]["role"] == "system":
        record["system"], turns = turns[0]["content"], turns[1:]
    record["conversations"] = [{"from": names[t["role"]], "value": t["content"]} for t in turns]
    return record


def as_alpaca(turns: list[dict[str, str]]) -> dict[str, Any]:
    record: dict[str, Any] = {"input": ""}
    if turns[0]["role"] == "system":
        record["system"], turns = turns[0]["content"], turns[1:]
    pairs = [[turns[i]["content"], turns[i + 1]["content"]] for i in range(0, len(turns), 2)]
    record["history"] = pairs[:-1]
    record["instruction"], record["output"] = pairs[-1]
    return record


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def write_array(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(records, ensure_ascii=False, indent=1))
    return path


def write_parquet(path: Path, records: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def write_saved(path: Path, records: list[dict[str, Any]]) -> Path:
    import datasets

    datasets.Dataset.from_list(records).save_to_disk(str(path))
    return path


def write_folder(path: Path, records: list[dict[str, Any]]) -> Path:
    path.mkdir()
    write_jsonl(path / "a.jsonl", records[: NUM // 2])
    write_array(path / "b.json", records[NUM // 2 :])
    (path / "README.md").write_text("not data")
    return path


LAYOUTS = {"messages": as_messages, "sharegpt": as_sharegpt, "alpaca": as_alpaca}
FILES = {
    "jsonl": lambda d, r: write_jsonl(d / "chats.jsonl", r),
    "json_lines_as_json": lambda d, r: write_jsonl(d / "chats.json", r),
    "json_array": lambda d, r: write_array(d / "chats.json", r),
    "parquet": lambda d, r: write_parquet(d / "chats.parquet", r),
    "save_to_disk": lambda d, r: write_saved(d / "saved", r),
    "folder": lambda d, r: write_folder(d / "folder", r),
}


def samples(records: list[Any]) -> list[tuple[list[int], list[int]]]:
    dataset = ChatDataset(records, QwenTokenizer(), 4096, None, template="chatml")
    return [(s["input_ids"].tolist(), s["labels"].tolist()) for s in dataset]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[list[int], list[int]]]:
    path = tmp_path_factory.mktemp("reference") / "reference.jsonl"
    write_jsonl(path, [{"id": k, **as_messages(c)} for k, c in enumerate(conversations())])
    records = jsonl_records(path).records
    assert len(records) == NUM
    return samples(records)


@pytest.mark.parametrize("kind", sorted(FILES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_and_file_kind_gives_the_messages_samples(
    layout: str, kind: str, reference, tmp_path: Path
) -> None:
    records = [LAYOUTS[layout](c) for c in conversations()]
    path = FILES[kind](tmp_path, records)
    read = jsonl_records(path)
    assert read.counts["read"] == NUM and len(read.records) == NUM
    assert read.detected == layout
    assert samples(read.records) == reference
    ids = [r["id"] for r in read.records]
    assert len(set(ids)) == NUM  # every record told apart, across the folder's files too


def test_the_layout_is_said_in_one_line_with_the_count(tmp_path: Path, caplog) -> None:
    path = write_array(tmp_path / "chats.json", [as_sharegpt(c) for c in conversations()])
    data = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(), name="jsonl", path=str(path), val_samples=0,
        record_dir=str(tmp_path / "records"), template="chatml",
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("read ")]
    assert said == [f"read {path} as ShareGPT (conversations: from/value), {NUM} records"]
    assert data.num_train_samples == NUM


def test_a_named_layout_is_not_guessed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [as_sharegpt(c) for c in conversations()[:3]])
    with pytest.raises(BadRecordError, match=r"c.jsonl:1: field 'messages': missing"):
        from odb_lightning.data.sources.jsonl import jsonl_source

        jsonl_source(path, layout="messages").collect()
    with pytest.raises(ValueError, match="data.source.format must be one of auto, messages"):
        jsonl_source(path, layout="vicuna")


@pytest.mark.parametrize(
    ("record", "field", "problem"),
    [
        ({"conversations": [{"from": "robot", "value": "x"}]}, FROM, "unknown role 'robot'"),
        ({"conversations": [{"from": "observation", "value": "x"}]}, FROM, "tool turn"),
        ({"conversations": []}, "conversations", "is empty"),
        ({"instruction": "x", "output": 3}, "output", "must be a string, got int"),
        ({"instruction": "x", "output": "y", "history": [["q"]]}, "history[0]", "pair of strings"),
        ({"prompt_text": "x"}, "<record>", "fit no known layout"),
    ],
)  # fmt: skip
def test_a_record_that_fits_no_layout_is_named(
    tmp_path: Path, record: dict, field: str, problem: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [record])
    with pytest.raises(BadRecordError) as refused:
        jsonl_records(path)
    assert refused.value.record == f"{path}:1" and refused.value.field == field
    assert problem in refused.value.problem
    skipped = jsonl_records(write_jsonl(tmp_path / "two.jsonl", [record]), on_bad_record="skip")
    assert skipped.counts["dropped/bad_record"] == 1 and len(skipped.records) == 0


def test_a_path_with_nothing_to_read_says_what_it_found(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    with pytest.raises(DataPathError, match=r"found \.txt; conversations are read from"):
        jsonl_records(folder)
    with pytest.raises(DataPathError, match="no such file or folder"):
        jsonl_records(tmp_path / "missing.jsonl")


def test_conversational_prompt_completion_is_the_chat_template_on_the_completion(
    tmp_path: Path,
) -> None:
    """One exchange each: the prompt's turns, then the completion's assistant turn."""
    single = [c for c in conversations() if sum(t["role"] == "user" for t in c) == 1]
    forms = [{"prompt": c[:-1], "completion": c[-1:]} for c in single]
    read = jsonl_records(write_jsonl(tmp_path / "pc.jsonl", forms))
    assert read.detected == "prompt_completion"
    assert samples(read.records) == samples([{"id": 0, "messages": c} for c in single])
    history = {"prompt": single[0][:-1] + single[0][-1:] + [single[0][-2]], "completion": []}
    with pytest.raises(BadRecordError, match="holds an assistant turn"):
        jsonl_records(write_jsonl(tmp_path / "history.jsonl", [history]))


def test_plain_prompt_completion_and_text_follow_their_own_rule(tmp_path: Path) -> None:
    """No template: the prompt's ids, the completion's and the end-of-sequence id; the loss
    on the completion and that id (every token of a ``text`` record)."""
    tokenizer = QwenTokenizer()
    rows = [
        {"prompt": "The capital of France is", "completion": " Paris."},
        {"text": "Once upon a time — ünïcode ✓"},
    ]
    prompt_ids = tokenizer.encode_text(rows[0]["prompt"])
    completion_ids = [*tokenizer.encode_text(rows[0]["completion"]), tokenizer.eos_id]
    text_ids = [*tokenizer.encode_text(rows[1]["text"]), tokenizer.eos_id]
    pc = jsonl_records(write_jsonl(tmp_path / "pc.jsonl", rows[:1]))
    text = jsonl_records(write_jsonl(tmp_path / "text.jsonl", rows[1:]))
    assert (pc.detected, text.detected) == ("prompt_completion", "text")
    ((ids, labels),) = samples(pc.records)
    assert ids == prompt_ids + completion_ids
    assert labels == [-100] * len(prompt_ids) + completion_ids
    assert samples(text.records) == [(text_ids, text_ids)]
    cut = len(prompt_ids) + 2  # data.sizes.truncation=tail: two completion tokens left
    dataset = ChatDataset(pc.records, tokenizer, cut, None, template="chatml", truncation="tail")
    assert dataset[0]["input_ids"].tolist() == (prompt_ids + completion_ids)[:cut]
    assert dataset.unsupervised_indices([0]) == []


def test_a_layout_of_ones_own_is_read_through_the_mapping(reference, tmp_path: Path) -> None:
    """LLaMA-Factory's ``columns``/``tags`` in small: the turns' field, the role and content
    keys, the speaker names."""
    from odb_lightning.data.config import DataSource
    from odb_lightning.data.formats import FieldMapping
    from odb_lightning.data.sources.jsonl import jsonl_source

    names = {"system": "sys", "user": "client", "assistant": "agent"}
    rows = [
        {"dialog": [{"speaker": names[t["role"]], "text": t["content"]} for t in c]}
        for c in conversations()
    ]
    path = write_jsonl(tmp_path / "own.jsonl", rows)
    mapping = {"messages": "dialog", "role": "speaker", "content": "text"}
    mapping["roles"] = {"sys": "system", "client": "user", "agent": "assistant"}
    read = jsonl_source(path, mapping=FieldMapping(**mapping)).collect()
    assert read.detected == "mapping" and samples(read.records) == reference
    source = DataSource("jsonl", path=str(path), mapping=mapping)
    assert source.mapping == FieldMapping(**mapping)
    with pytest.raises(ValueError, match="data.source.mapping is a layout of its own"):
        DataSource("jsonl", path=str(path), format="sharegpt", mapping=mapping)
    with pytest.raises(ValueError, match="data.source.format=sharegpt: data.source.name=chitchat"):
        DataSource("chitchat", format="sharegpt")
    with pytest.raises(BadRecordError, match="field 'dialog': missing"):
        jsonl_source(write_jsonl(tmp_path / "x.jsonl", [{"messages": []}]),
                     mapping=FieldMapping(**mapping)).collect()  # fmt: skip


@pytest.mark.parametrize("kind", ["json_array", "parquet", "folder"])
@pytest.mark.parametrize("layout", ["sharegpt", "alpaca"])
def test_a_streamed_layout_gives_the_messages_samples(
    layout: str, kind: str, reference, tmp_path: Path
) -> None:
    from odb_lightning.data.stream import ChatStream
    from odb_lightning.data.stream_convert import write_chat_stream

    path = FILES[kind](tmp_path, [LAYOUTS[layout](c) for c in conversations()])
    counts = write_chat_stream(path, tmp_path / "chunks", "raise", chunk_bytes="1MB")
    stream = ChatStream(tmp_path / "chunks")
    assert counts["kept"] == NUM and stream.layout == layout
    part = stream.part(1, 0)
    records = [record for _, record in stream.records(part, 0)]
    assert samples(records) == reference


def test_a_glob_is_keyed_by_the_files_it_matches(tmp_path: Path) -> None:
    from odb_lightning.data.sources.source_records import source_version

    records = [as_messages(c) for c in conversations()]
    write_jsonl(tmp_path / "a.jsonl", records[:10])
    pattern = str(tmp_path / "*.jsonl")
    before = source_version("jsonl", pattern)
    write_jsonl(tmp_path / "b.jsonl", records[10:20])  # a new match: another version
    assert source_version("jsonl", pattern) != before
    between = source_version("jsonl", pattern)
    write_jsonl(tmp_path / "a.jsonl", records[:11])  # a match changed: another version
    assert source_version("jsonl", pattern) != between


def write_hub_copy(path: Path, records: list[dict[str, Any]]) -> Path:
    """A local copy of a hub repository: a dataset card and the data in ``data/``."""
    (path / "data").mkdir(parents=True)
    (path / "README.md").write_text("---\nlicense: mit\n---\n# chats\n")
    write_parquet(path / "data" / "train-00000-of-00001.parquet", records)
    return path


def test_a_copy_of_a_hub_repository_is_read_with_datasets(reference, tmp_path: Path) -> None:
    path = write_hub_copy(tmp_path / "repo", [as_sharegpt(c) for c in conversations()])
    read = jsonl_records(path)
    assert read.detected == "sharegpt" and samples(read.records) == reference


def test_an_unreachable_hub_name_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import huggingface_hub.constants

    from odb_lightning.data.sources.ultrachat import ultrachat_records

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("[Errno -2] Name or service not known")

    # As on a machine without the hub: the probe answers at once, before datasets retries.
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DataPathError) as error:
        jsonl_records("someone/chats")
    assert str(error.value) == (
        "data.source.path='someone/chats' is a hub name, and huggingface.co:443 is not "
        "reachable from this machine ([Errno -2] Name or service not known): save the set "
        "with save_to_disk or as parquet where the hub is reachable, and give its folder"
    )
    with pytest.raises(OSError, match=r"'HuggingFaceH4/ultrachat_200k' is a hub name, and hug"):
        ultrachat_records("HuggingFaceH4/ultrachat_200k")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataPathError, match="is a hub name, and HF_HUB_OFFLINE is set: save"):
        jsonl_records("someone/chats")
    with pytest.raises(DataPathError, match=r"no such file or folder \(nor a hub name"):
        jsonl_records("./missing/chats.jsonl")
