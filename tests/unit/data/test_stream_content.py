"""A stream proves its content (data/stream.py, data/content_digest.py): a damaged, cut or
missing chunk is found when the stream is opened and converted again naming the file, a
planted stream directory is refused naming it, and a record that cannot be decoded fails
naming its index, its chunk and the fix."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import odb_lightning.data.content_digest as content_digest
from odb_lightning.data.stream import ChatStream, StreamError
from odb_lightning.data.stream_convert import (
    convert_jsonl_stream,
    stream_fingerprint,
    stream_problem,
    write_chat_stream,
)

pytest.importorskip("litdata")

TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def _jsonl(path: Path, count: int = 6) -> Path:
    lines = [json.dumps({"id": f"r{k}", "messages": TURNS}) for k in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _records(directory: Path) -> list[dict]:
    stream = ChatStream(directory)
    return [record for _, record in stream.records(stream.part(1, 0), 0)]


def _chunk(directory: Path) -> Path:
    (chunk,) = directory.glob("chunk-*.bin")
    return chunk


def _replace_in_place(path: Path, needle: bytes, replacement: bytes) -> None:
    data = path.read_bytes()
    assert len(needle) == len(replacement) and needle in data
    with path.open("r+b") as file:  # in place: what a bad sector leaves
        file.write(data.replace(needle, replacement, 1))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A JSON Lines file and its stream, converted once for the module."""
    root = tmp_path_factory.mktemp("stream")
    jsonl = _jsonl(root / "chats.jsonl")
    directory = root / "written"
    write_chat_stream(jsonl, directory, "skip")
    return jsonl, directory


def _cached(written: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """The module's stream, copied where ``convert_jsonl_stream`` finds it."""
    jsonl, directory = written
    cache = tmp_path / "streams"
    target = cache / stream_fingerprint(jsonl, "skip")
    shutil.copytree(directory, target)
    return jsonl, cache, target


@pytest.mark.parametrize("damage", ["flip", "cut", "missing"])
def test_a_damaged_cut_or_missing_chunk_is_named(
    written: tuple[Path, Path], tmp_path: Path, damage: str
) -> None:
    directory = shutil.copytree(written[1], tmp_path / "stream")
    assert stream_problem(directory) is None
    chunk = _chunk(directory)
    if damage == "flip":
        _replace_in_place(chunk, b"r3", b"r9")  # valid UTF-8: would train silently
        assert stream_problem(directory) == (
            f"{chunk.name}: page 0 of 1 (bytes 0 on) differs from its digest when written"
        )
    elif damage == "cut":
        size = chunk.stat().st_size
        chunk.write_bytes(chunk.read_bytes()[:-7])
        assert stream_problem(directory) == (
            f"{chunk.name}: {size - 7:,} bytes, {size:,} when written"
        )
    else:
        chunk.unlink()
        assert stream_problem(directory) == (
            f"FileNotFoundError: [Errno 2] No such file or directory: '{chunk}'"
        )


@pytest.mark.slow  # a conversion in a spawned process; the record tables' test is default
def test_a_damaged_stream_is_converted_again(
    written: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jsonl, cache, target = _cached(written, tmp_path)
    first = _records(target)
    _replace_in_place(_chunk(target), b"r3", b"r9")
    with caplog.at_level(logging.WARNING):
        again = convert_jsonl_stream(jsonl, cache, "skip")
    assert again == target
    assert f"the stream {target} is damaged (chunk-0-0.bin: page 0 of 1" in caplog.text
    assert _records(again) == first


def test_a_planted_stream_directory_is_refused_naming_it(
    written: tuple[Path, Path], tmp_path: Path
) -> None:
    jsonl, cache, target = _cached(written, tmp_path)
    elsewhere = target.rename(tmp_path / "elsewhere")
    target.symlink_to(elsewhere)
    with pytest.raises(StreamError) as refused:
        convert_jsonl_stream(jsonl, cache, "skip")
    assert str(refused.value) == (
        f"the stream {target} is not the cache's own: {target} is a symbolic link (to "
        f"{elsewhere}), and the conversion writes real files only. Remove it "
        f"(rm -r {target}) and the next run converts the source again"
    )


def test_an_undecodable_record_names_its_index_chunk_and_the_fix(
    written: tuple[Path, Path], tmp_path: Path
) -> None:
    directory = shutil.copytree(written[1], tmp_path / "stream")
    chunk = _chunk(directory)
    _replace_in_place(chunk, b"r3", b"\xff\xfe")  # damage after the open's check
    stream = ChatStream(directory)
    with pytest.raises(StreamError) as bad:
        stream.part(1, 0)  # reads the first record, and LitData its neighbours
    message = str(bad.value)
    assert f"the first record of this rank's part of the stream at {directory} cannot" in message
    assert "UnicodeDecodeError" in message
    assert f"delete {directory} and the next run converts the source again" in message
    assert (
        stream.undecodable(3, ValueError("x"))
        .args[0]
        .startswith(f"record 3 of the stream at {directory} ({chunk.name}) cannot be decoded")
    )


def test_large_files_are_checked_at_their_ends_and_drawn_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(content_digest, "PAGE_BYTES", 4)
    monkeypatch.setattr(content_digest, "FULL_CHECK_BYTES", 8)
    monkeypatch.setattr(content_digest, "SAMPLED_PAGES", 1)
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(40)))  # 10 pages: over the whole-check bound
    digest = content_digest.content_digest(path)
    assert content_digest.content_problem({path: digest}) is None
    damaged = bytearray(path.read_bytes())
    damaged[39] ^= 1  # in the last page: always read
    path.write_bytes(bytes(damaged))
    assert content_digest.content_problem({path: digest}) == (
        "data.bin: page 9 of 10 (bytes 36 on) differs from its digest when written"
    )
