"""``data.streaming=true`` on the data module: the settings a stream cannot serve are
refused naming the key and the fix; a streamed module trains on every record of the file
through the stream, in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.stream_convert import stream_fingerprint, write_chat_stream
from odb_lightning.lit.data.datamodule import ODBDataModule

FIXED = {"shard_dealing": "fixed", "token_budget": 4096}


@pytest.mark.parametrize(
    ("source", "batching", "sizes", "message"),
    [
        ("sharegpt", FIXED, {}, "data=jsonl"),
        ("jsonl", {"mode": "sorted"}, {}, "batching=odb or odb_packed"),
        ("jsonl", {}, {}, "batching.policy.shard_dealing=fixed"),
        ("jsonl", FIXED, {"val_samples": 0.05}, "data.sizes.val_samples=0"),
        ("jsonl", FIXED, {"max_samples": 100}, "data.sizes.max_samples=100 must be null"),
    ],
)
def test_settings_a_stream_cannot_serve_are_refused(
    tokenizer, source: str, batching: dict, sizes: dict, message: str
) -> None:
    arguments = {"val_samples": 0, "max_samples": None} | sizes
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        ODBDataModule.of(
        tokenizer, BatchingConfig.of(**batching), name=source, path="x.jsonl", streaming=True,
            stream_dir="cache", template="chatml", **arguments,
        )  # fmt: skip


def test_a_streamed_module_trains_on_every_record(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "chats.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path.write_text("".join(json.dumps({"id": k, "messages": turns}) + "\n" for k in range(25)))
    cache = tmp_path / "streams"
    # Written here, as the conversion's child would (that path is tested in data/).
    write_chat_stream(path, cache / stream_fingerprint(path, "raise"), "raise")
    data = ODBDataModule.of(
        tokenizer, BatchingConfig.of(num_workers=0, **FIXED), name="jsonl", path=str(path),
        max_samples=None, val_samples=0, streaming=True, stream_dir=str(cache),
        template="chatml",
    )  # fmt: skip
    data.setup("fit")
    assert data.num_train_samples == 25 and data.source_counts["kept"] == 25
    loader = data.train_dataloader()
    ids = [i for batch in loader for i in batch.meta.sample_ids]
    assert sorted(ids) == list(range(25))
    assert data.record_ids([3]) == [3]
    assert data.data_identity()["stream"] == stream_fingerprint(path, "raise")
    data.teardown("fit")
